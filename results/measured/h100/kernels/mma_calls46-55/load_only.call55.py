import torch
from qerl_kernels import fp4_mma, nvfp4, fp4_launch
from qerl_kernels.bench import time_calls, copies_for, _clone_prepared, read_ceiling
from qerl_kernels.reference import nvfp4_quantize_reference
L2 = torch.cuda.get_device_properties(0).L2_cache_size
print("ceiling", read_ceiling())
for n, k in ((37888, 3584), (3584, 18944)):
    p = nvfp4.prepare(*nvfp4_quantize_reference(torch.randn(n, k, device="cuda") * 0.02))
    cp = [p] + [_clone_prepared(p) for _ in range(copies_for(p.nbytes, L2) - 1)]
    x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
    rows = [("default", cp, None)]
    for tiled in (False, True):
        ws = [fp4_mma.tile_prepared(q, 1, 2) for q in cp] if tiled else cp
        for lo in (0, 1, 2):
            for st, cps in ((2, 16), (3, 16), (4, 16)):
                rows.append((f"mma tiled={tiled} load_only={lo} stages={st} cps={cps}", ws, dict(NW=1, CH=2, STAGES=st, CPS=cps, TILED=tiled, LOAD_ONLY=lo)))
    for name, ws, cfg in rows:
        f = (lambda q: fp4_launch.fp4_gemm(x, q)) if cfg is None else (lambda q, c=cfg: fp4_mma.fp4_gemm_mma(x, q, config=c))
        t, _ = time_calls([lambda q=q: f(q) for q in ws])
        print(f"{n}x{k} M=1 {name}: {t * 1e3:.1f} us {p.nbytes / t / 1e6:.0f} GB/s", flush=True)
