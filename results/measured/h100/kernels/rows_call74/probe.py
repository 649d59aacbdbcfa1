"""Issue 22, call 74: the row-block grid at M = 8 (batch 8) on the 14B / 32B launches with the engine's epilogues
(q/k/v: bias; o and down: LoRA rank 32 + residual, PRE 1; gate/up: none), as call 72 on the 7B ones, beside the
default path timed first and last. Every row twice, the order reversed the second time.
Run: PYTHONPATH=$PWD python3 <this file>."""
import torch

from qerl_kernels import fp4_launch, fp4_mma, nvfp4
from qerl_kernels.bench import _clone_prepared, copies_for, read_ceiling, time_calls
from qerl_kernels.reference import nvfp4_quantize_reference

L2 = torch.cuda.get_device_properties(0).L2_cache_size
ceil, _ = read_ceiling()
print(f"read ceiling {ceil:.0f} GB/s", flush=True)
R = 32
KNOBS = [(4, 6, 80), (8, 3, 80), (4, 4, 96), (8, 3, 96), (8, 2, 88)]
M = 8
SHAPES = {"qkv 14B/32B": (7168, 5120, "bias"), "o 14B/32B": (5120, 5120, "lora"),
          "gate/up 14B": (27648, 5120, None), "down 14B": (5120, 13824, "lora"),
          "gate/up 32B": (55296, 5120, None), "down 32B": (5120, 27648, "lora")}
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
    knobs = [dict(KW=kw, CPB=cpb, MAXNREG=mx) for kw, cpb, mx in KNOBS]
    rows = [("default path", None)] + [(" ".join(f"{a}={b}" for a, b in c.items()), dict(c, GRID="rows", SPLIT=1))
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
