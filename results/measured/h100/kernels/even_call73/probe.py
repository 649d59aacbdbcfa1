"""Issue 22, call 73: the row-block grid's loads without masks where every warp's units fall inside the run (EVEN_U:
on for 7B gate/up; the table's knobs with EVEN_U False beside it) on the 7B launches at M = 1 with the engine's
epilogues; o also with a 88-register cap and PRE 2. The default dispatch (the table) timed first and last. Every row
twice, the order reversed the second time. Run: PYTHONPATH=$PWD python3 <this file>."""
import torch

from qerl_kernels import fp4_launch, fp4_mma, nvfp4
from qerl_kernels.bench import _clone_prepared, copies_for, read_ceiling, time_calls
from qerl_kernels.reference import nvfp4_quantize_reference

L2 = torch.cuda.get_device_properties(0).L2_cache_size
ceil, _ = read_ceiling()
print(f"read ceiling {ceil:.0f} GB/s", flush=True)
R = 32
SHAPES = {"gate/up 7B": (37888, 3584, None, [dict(EVEN_U=False)]),
          "down 7B": (3584, 18944, "lora", []),
          "o 7B": (3584, 3584, "lora", [dict(MAXNREG=88), dict(PRE=2)]),
          "qkv 7B": (4608, 3584, "bias", [])}
for label, (n, k, epi_kind, extra) in SHAPES.items():
    p = nvfp4.prepare(*nvfp4_quantize_reference(torch.randn(n, k, device="cuda") * 0.02))
    cp = [p] + [_clone_prepared(q) for q in [p] * (copies_for(p.nbytes, L2) - 1)]
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16, generator=g)
    t = torch.randn(1, R, device="cuda", dtype=torch.bfloat16, generator=g)
    lb = 0.02 * torch.randn(n, R, device="cuda", dtype=torch.bfloat16, generator=g)
    res = torch.randn(1, n, device="cuda", dtype=torch.bfloat16, generator=g)
    bias = torch.randn(n, device="cuda", dtype=torch.bfloat16, generator=g)
    epi = {"bias": dict(bias=bias), "lora": dict(lora=(t, lb), residual=res), None: {}}[epi_kind]
    table = fp4_mma.MEASURED_WINS[("h100", 0, "bf16", n, k, 1)]
    with torch.no_grad():
        ref = (fp4_mma.fp4_gemm_mma(x, p, **epi, config=dict(table, EVEN_U=False))).float()
    rows = [("table (default dispatch)", None)] + [(" ".join(f"{a}={b}" for a, b in c.items()), dict(table, **c))
                                                   for c in extra] + [("table (last)", None)]
    for rep, order in enumerate((rows, rows[::-1])):
        for name, cfg in order:
            if cfg is None:
                f = lambda q: fp4_launch.fp4_gemm(x, q, **epi)  # noqa: E731
            else:
                f = lambda q, c=cfg: fp4_mma.fp4_gemm_mma(x, q, **epi, config=c)  # noqa: E731
            try:
                err = ""
                if rep == 0:
                    err = f" max|diff| vs EVEN_U False {(f(p).float() - ref).abs().max().item():.2e}"
                t_s, _ = time_calls([lambda q=q: f(q) for q in cp])
                print(f"{label} {n}x{k} M=1 pass {rep} {name}: {t_s * 1e3:.2f} us "
                      f"({100 * p.nbytes / t_s / 1e6 / ceil:.0f} %){err}", flush=True)
            except Exception as e:  # noqa: BLE001 - one failing variant must not end the probe
                print(f"{label} {n}x{k} M=1 pass {rep} {name}: FAILED {type(e).__name__}: {str(e)[:300]}",
                      flush=True)
    del cp
    torch.cuda.empty_cache()
