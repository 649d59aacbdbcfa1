"""Issue 22, call 64: fp4_mma's row-block grid made persistent (program p takes row blocks p, p + P, ...: its
set-up once, one wave; CPB programs an SM, MAXNREG a register cap so that they fit) against one program a row block
(CPB 0, call 60's grid) and the default path; 7B shapes at M = 1. Run: PYTHONPATH=$PWD python3 <this file>."""
import torch

from qerl_kernels import fp4_launch, fp4_mma, nvfp4
from qerl_kernels.bench import _clone_prepared, copies_for, read_ceiling, time_calls
from qerl_kernels.reference import nvfp4_quantize_reference

L2 = torch.cuda.get_device_properties(0).L2_cache_size
ceil, _ = read_ceiling()
print(f"read ceiling {ceil:.0f} GB/s", flush=True)
SHAPES = {(37888, 3584): (4, 2), (3584, 18944): (8, 4), (3584, 3584): (8, 4), (4608, 3584): (8, 4)}
for (n, k), kws in SHAPES.items():
    p = nvfp4.prepare(*nvfp4_quantize_reference(torch.randn(n, k, device="cuda") * 0.02))
    cp = [p] + [_clone_prepared(q) for q in [p] * (copies_for(p.nbytes, L2) - 1)]
    tiled = [fp4_mma.tile_prepared(q, 1, 2) for q in cp]
    x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
    ref = fp4_launch.fp4_gemm(x, p).float()
    rows = [("default", cp, None)]
    for kw in kws:
        splits = (1,) if n > 4608 else (1, 2)
        for split in splits if k < 18944 else (1, 2, 4):
            for t in (True, False):
                ws = tiled if t else cp
                base = dict(GRID="rows", KW=kw, SPLIT=split, TILED=t)
                rows.append((f"kw={kw} split={split} tiled={t} one program a block", ws, dict(base, CPB=0)))
                for cpb, mx in ((24 // kw, 0), (24 // kw, 80), (16 // kw, 0)):
                    if cpb >= 1:
                        rows.append((f"kw={kw} split={split} tiled={t} persistent cpb={cpb} maxnreg={mx}", ws,
                                     dict(base, CPB=cpb, MAXNREG=mx)))
    for name, ws, cfg in rows:
        if cfg is None:
            f = lambda q: fp4_launch.fp4_gemm(x, q)  # noqa: E731
        else:
            f = lambda q, c=cfg: fp4_mma.fp4_gemm_mma(x, q, config=c)  # noqa: E731
        try:
            err = ""
            if cfg is not None:
                d = (f(ws[0]).float() - ref).abs().max().item()
                err = f" max|diff| vs default {d:.2e} (|ref| {ref.abs().max().item():.1e})"
            t_s, mode = time_calls([lambda q=q: f(q) for q in ws])
            print(f"{n}x{k} M=1 {name}: {t_s * 1e3:.1f} us ({100 * p.nbytes / t_s / 1e6 / ceil:.0f} %) [{mode}]{err}",
                  flush=True)
        except Exception as e:  # noqa: BLE001 - one failing variant must not end the probe
            print(f"{n}x{k} M=1 {name}: FAILED {type(e).__name__}: {str(e)[:300]}", flush=True)
    del cp, tiled
    torch.cuda.empty_cache()
