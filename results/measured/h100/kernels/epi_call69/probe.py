"""Issue 22, call 69: the row-block grid's programs an SM on the 7B gate/up launch at M = 1 (CPB 9: 1,188 programs
of exactly two row blocks each, against 12: 1,584 programs, half of them two row blocks, half one), q/k/v (bias) and
o (LoRA rank 32 + residual, PRE 1) at 4 and 8 warps, every row timed twice (the order reversed the second time).
Run: PYTHONPATH=$PWD python3 <this file>."""
import torch

from qerl_kernels import fp4_launch, fp4_mma, nvfp4
from qerl_kernels.bench import _clone_prepared, copies_for, read_ceiling, time_calls
from qerl_kernels.reference import nvfp4_quantize_reference

L2 = torch.cuda.get_device_properties(0).L2_cache_size
ceil, _ = read_ceiling()
print(f"read ceiling {ceil:.0f} GB/s", flush=True)
R = 32
CASES = {(37888, 3584): [dict(KW=2, CPB=c, MAXNREG=80) for c in (9, 10, 11, 12)] + [dict(KW=4, CPB=6, MAXNREG=80)],
         (4608, 3584): [dict(KW=4, CPB=6, MAXNREG=80), dict(KW=8, CPB=3, MAXNREG=80), dict(KW=2, CPB=12, MAXNREG=80)],
         (3584, 3584): [dict(KW=8, CPB=3, MAXNREG=80), dict(KW=4, CPB=6, MAXNREG=80), dict(KW=8, CPB=2, MAXNREG=96)]}
for (n, k), knobs in CASES.items():
    p = nvfp4.prepare(*nvfp4_quantize_reference(torch.randn(n, k, device="cuda") * 0.02))
    cp = [p] + [_clone_prepared(q) for q in [p] * (copies_for(p.nbytes, L2) - 1)]
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16, generator=g)
    t = torch.randn(1, R, device="cuda", dtype=torch.bfloat16, generator=g)
    lb = 0.02 * torch.randn(n, R, device="cuda", dtype=torch.bfloat16, generator=g)
    res = torch.randn(1, n, device="cuda", dtype=torch.bfloat16, generator=g)
    bias = torch.randn(n, device="cuda", dtype=torch.bfloat16, generator=g)
    epi = {(4608, 3584): dict(bias=bias), (3584, 3584): dict(lora=(t, lb), residual=res)}.get((n, k), {})
    base = fp4_launch.fp4_gemm(x, p, **epi).float()
    rows = [("default path", None)] + [(" ".join(f"{a}={b}" for a, b in c.items()), dict(c, GRID="rows", SPLIT=1))
                                       for c in knobs]
    for rep, order in enumerate((rows, rows[::-1])):
        for name, cfg in order:
            if cfg is None:
                f = lambda q: fp4_launch.fp4_gemm(x, q, **epi)  # noqa: E731
            else:
                f = lambda q, c=cfg: fp4_mma.fp4_gemm_mma(x, q, **epi, config=c)  # noqa: E731
            try:
                err = ""
                if rep == 0:
                    err = f" max|diff| vs default {(f(p).float() - base).abs().max().item():.2e}"
                t_s, _ = time_calls([lambda q=q: f(q) for q in cp])
                print(f"{n}x{k} M=1 pass {rep} {name}: {t_s * 1e3:.2f} us "
                      f"({100 * p.nbytes / t_s / 1e6 / ceil:.0f} %){err}", flush=True)
            except Exception as e:  # noqa: BLE001 - one failing variant must not end the probe
                print(f"{n}x{k} M=1 pass {rep} {name}: FAILED {type(e).__name__}: {str(e)[:300]}", flush=True)
    del cp
    torch.cuda.empty_cache()
