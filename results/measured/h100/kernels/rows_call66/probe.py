"""Issue 22, call 66: the persistent row-block grid's programs an SM (CPB) and register cap (MAXNREG) on the 7B
gate/up and down launches at M = 1 (row-major weights), beside the default path and MEASURED_WINS' knobs, every
shape's rows timed twice (the order reversed the second time) so that the lease's drift shows.
Run: PYTHONPATH=$PWD python3 <this file>."""
import torch

from qerl_kernels import fp4_launch, fp4_mma, nvfp4
from qerl_kernels.bench import _clone_prepared, copies_for, read_ceiling, time_calls
from qerl_kernels.reference import nvfp4_quantize_reference

L2 = torch.cuda.get_device_properties(0).L2_cache_size
ceil, _ = read_ceiling()
print(f"read ceiling {ceil:.0f} GB/s", flush=True)
GRIDS = {(37888, 3584): [(kw, 1, cpb, mx) for kw, cpbs in ((1, (16, 20, 24)), (2, (8, 10, 12)), (4, (4, 5, 6)))
                         for cpb in cpbs for mx in (64, 72, 80)],
         (3584, 18944): [(kw, sp, cpb, mx) for kw, sp in ((8, 1), (4, 2), (4, 1)) for cpb in (24 // kw, 16 // kw)
                         for mx in (64, 72, 80, 96)]}
for (n, k), grid in GRIDS.items():
    p = nvfp4.prepare(*nvfp4_quantize_reference(torch.randn(n, k, device="cuda") * 0.02))
    cp = [p] + [_clone_prepared(q) for q in [p] * (copies_for(p.nbytes, L2) - 1)]
    x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
    ref = fp4_launch.fp4_gemm(x, p).float()
    rows = [("default", None)] + [(f"kw={kw} split={sp} cpb={cpb} maxnreg={mx}",
                                   dict(GRID="rows", KW=kw, SPLIT=sp, CPB=cpb, MAXNREG=mx)) for kw, sp, cpb, mx in grid]
    for rep, order in enumerate((rows, rows[::-1])):
        for name, cfg in order:
            if cfg is None:
                f = lambda q: fp4_launch.fp4_gemm(x, q)  # noqa: E731
            else:
                f = lambda q, c=cfg: fp4_mma.fp4_gemm_mma(x, q, config=c)  # noqa: E731
            try:
                err = ""
                if cfg is not None and rep == 0:
                    d = (f(p).float() - ref).abs().max().item()
                    err = f" max|diff| vs default {d:.2e}"
                t_s, _ = time_calls([lambda q=q: f(q) for q in cp])
                print(f"{n}x{k} M=1 pass {rep} {name}: {t_s * 1e3:.1f} us "
                      f"({100 * p.nbytes / t_s / 1e6 / ceil:.0f} %){err}", flush=True)
            except Exception as e:  # noqa: BLE001 - one failing variant must not end the probe
                print(f"{n}x{k} M=1 pass {rep} {name}: FAILED {type(e).__name__}: {str(e)[:200]}", flush=True)
    del cp
    torch.cuda.empty_cache()
