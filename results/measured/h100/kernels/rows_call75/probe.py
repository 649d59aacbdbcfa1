"""Issue 22, call 75: the 7B down launch at M = 1 (224 row blocks of 16 rows: 1.7 programs an SM at SPLIT 1)
with its row blocks split over programs (SPLIT 2-4) at 4 and 8 warps and register caps 80 / 96, without the
epilogue (its LoRA runs in the last part's epilogue at SPLIT > 1) and with it, beside the table's knobs.
Every row twice, the order reversed the second time. Run: PYTHONPATH=$PWD python3 <this file>."""
import torch

from qerl_kernels import fp4_launch, fp4_mma, nvfp4
from qerl_kernels.bench import _clone_prepared, copies_for, read_ceiling, time_calls
from qerl_kernels.reference import nvfp4_quantize_reference

L2 = torch.cuda.get_device_properties(0).L2_cache_size
ceil, _ = read_ceiling()
print(f"read ceiling {ceil:.0f} GB/s", flush=True)
R = 32
M = 1
SHAPES = {"down 7B": (3584, 18944, None), "down 7B + LoRA / residual": (3584, 18944, "lora")}
for label, (n, k, epi_kind) in SHAPES.items():
    p = nvfp4.prepare(*nvfp4_quantize_reference(torch.randn(n, k, device="cuda") * 0.02))
    cp = [p] + [_clone_prepared(q) for q in [p] * (copies_for(p.nbytes, L2) - 1)]
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(M, k, device="cuda", dtype=torch.bfloat16, generator=g)
    t = torch.randn(M, R, device="cuda", dtype=torch.bfloat16, generator=g)
    lb = 0.02 * torch.randn(n, R, device="cuda", dtype=torch.bfloat16, generator=g)
    res = torch.randn(M, n, device="cuda", dtype=torch.bfloat16, generator=g)
    bias = torch.randn(n, device="cuda", dtype=torch.bfloat16, generator=g)
    epi = {"bias": dict(bias=bias), "lora": dict(lora=(t, lb), residual=res), None: {}}[epi_kind]
    base = fp4_launch.fp4_gemm(x, p, **epi).float()
    knobs = [dict(KW=8, CPB=3, MAXNREG=96, SPLIT=1)] + [
        dict(KW=kw, SPLIT=sp, CPB=24 // kw, MAXNREG=mx) for kw, sp, mx in
        ((4, 2, 80), (4, 3, 80), (4, 4, 80), (8, 2, 80), (4, 3, 96), (2, 4, 80), (2, 6, 80))]
    rows = [("default path", None)] + [(" ".join(f"{a}={b}" for a, b in c.items()), dict(c, GRID="rows"))
                                       for c in knobs] + [("default path (last)", None)]
    for rep, order in enumerate((rows, rows[::-1])):
        for name, cfg in order:
            if cfg is None:
                f = lambda q: fp4_launch.fp4_gemm(x, q, **epi)  # noqa: E731
            else:
                f = lambda q, c=cfg: fp4_mma.fp4_gemm_mma(x, q, **epi, config=c)  # noqa: E731
            try:
                err = ""
                if rep == 0 and cfg is not None:
                    err = f" max|diff| vs default {(f(p).float() - base).abs().max().item():.2e}"
                t_s, _ = time_calls([lambda q=q: f(q) for q in cp])
                print(f"{label} {n}x{k} M={M} pass {rep} {name}: {t_s * 1e3:.2f} us "
                      f"({100 * p.nbytes / t_s / 1e6 / ceil:.0f} %){err}", flush=True)
            except Exception as e:  # noqa: BLE001 - one failing variant must not end the probe
                print(f"{label} {n}x{k} M={M} pass {rep} {name}: FAILED {type(e).__name__}: {str(e)[:300]}",
                      flush=True)
    del cp
    torch.cuda.empty_cache()
