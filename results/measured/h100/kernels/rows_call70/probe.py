"""Issue 22, call 70: the row-block grid's knobs (warps a row block KW, programs an SM CPB, register cap MAXNREG; the
LoRA epilogue PRE) on the 14B and 32B decode launches at M = 1, with the engine's epilogues (q/k/v: bias; o and
down: LoRA rank 32 + residual; gate/up: none), beside the default path timed first and last (the lease's drift).
Every row timed twice, the order reversed the second time. Run: PYTHONPATH=$PWD python3 <this file>."""
import torch

from qerl_kernels import fp4_launch, fp4_mma, nvfp4
from qerl_kernels.bench import _clone_prepared, copies_for, read_ceiling, time_calls
from qerl_kernels.reference import nvfp4_quantize_reference

L2 = torch.cuda.get_device_properties(0).L2_cache_size
ceil, _ = read_ceiling()
print(f"read ceiling {ceil:.0f} GB/s", flush=True)
R = 32
KNOBS = [(2, 12, 80), (4, 6, 80), (8, 3, 80), (8, 3, 96), (8, 2, 96), (4, 4, 96)]
SHAPES = {"qkv 14B/32B": (7168, 5120, "bias"), "o 14B/32B": (5120, 5120, "lora"),
          "gate/up 14B": (27648, 5120, None), "down 14B": (5120, 13824, "lora"),
          "gate/up 32B": (55296, 5120, None), "down 32B": (5120, 27648, "lora")}
for label, (n, k, epi_kind) in SHAPES.items():
    p = nvfp4.prepare(*nvfp4_quantize_reference(torch.randn(n, k, device="cuda") * 0.02))
    cp = [p] + [_clone_prepared(q) for q in [p] * (copies_for(p.nbytes, L2) - 1)]
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16, generator=g)
    t = torch.randn(1, R, device="cuda", dtype=torch.bfloat16, generator=g)
    lb = 0.02 * torch.randn(n, R, device="cuda", dtype=torch.bfloat16, generator=g)
    res = torch.randn(1, n, device="cuda", dtype=torch.bfloat16, generator=g)
    bias = torch.randn(n, device="cuda", dtype=torch.bfloat16, generator=g)
    epi = {"bias": dict(bias=bias), "lora": dict(lora=(t, lb), residual=res), None: {}}[epi_kind]
    base = fp4_launch.fp4_gemm(x, p, **epi).float()
    knobs = [dict(KW=kw, CPB=cpb, MAXNREG=mx) for kw, cpb, mx in KNOBS]
    if epi_kind == "lora":
        knobs += [dict(KW=8, CPB=3, MAXNREG=96, PRE=2), dict(KW=8, CPB=3, MAXNREG=80, PRE=2)]
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
                print(f"{label} {n}x{k} M=1 pass {rep} {name}: {t_s * 1e3:.2f} us "
                      f"({100 * p.nbytes / t_s / 1e6 / ceil:.0f} %){err}", flush=True)
            except Exception as e:  # noqa: BLE001 - one failing variant must not end the probe
                print(f"{label} {n}x{k} M=1 pass {rep} {name}: FAILED {type(e).__name__}: {str(e)[:300]}",
                      flush=True)
    del cp
    torch.cuda.empty_cache()
