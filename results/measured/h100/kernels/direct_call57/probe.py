"""Issue 22, call 57: fp4_mma's words and scale entries loaded straight into registers (DIRECT) against its
cp.async ring and the default path, built up step by step (LOAD_ONLY 2: the weight stream alone; 1: + the
activation loads; 0: the whole kernel), 7B shapes at M = 1 (gate/up, down, o, q/k/v) and the gate/up group at M = 8.
Every row: time of one launch on rotating weight copies (bench.time_calls), GB/s of weight bytes; the full kernels'
outputs checked against the default path's. Run: PYTHONPATH=$PWD python3 <this file>."""
import torch

from qerl_kernels import fp4_launch, fp4_mma, nvfp4
from qerl_kernels.bench import _clone_prepared, copies_for, read_ceiling, time_calls
from qerl_kernels.reference import nvfp4_quantize_reference

L2 = torch.cuda.get_device_properties(0).L2_cache_size
ceil, parts = read_ceiling()
print(f"read ceiling {ceil:.0f} GB/s {parts}", flush=True)
SHAPES = [((37888, 3584), (1, 8)), ((3584, 18944), (1,)), ((3584, 3584), (1,)), ((4608, 3584), (1,))]
for (n, k), ms in SHAPES:
    p = nvfp4.prepare(*nvfp4_quantize_reference(torch.randn(n, k, device="cuda") * 0.02))
    cp = [p] + [_clone_prepared(q) for q in [p] * (copies_for(p.nbytes, L2) - 1)]
    tiled = [fp4_mma.tile_prepared(q, 1, 2) for q in cp]
    for m in ms:
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        ref = fp4_launch.fp4_gemm(x, p).float()
        rows = [("default", cp, None), ("ring tiled st2 cps16", tiled, dict(NW=1, CH=2, STAGES=2, CPS=16, TILED=True))]
        lo_set = (2, 1, 0) if m == 1 and n != 4608 else (0,)
        for t in ((True, False) if m == 1 else (True,)):
            for lo in lo_set:
                for st in (1, 2, 3):
                    rows.append((f"direct tiled={t} load_only={lo} stages={st} cps16", tiled if t else cp,
                                 dict(NW=1, CH=2, STAGES=st, CPS=16, TILED=t, DIRECT=True, LOAD_ONLY=lo)))
        for extra in (dict(CPS=8), dict(CPS=24), dict(CPS=32), dict(NW=2, CPS=8), dict(NW=2, CPS=12)):
            cfg = dict(dict(NW=1, CH=2, STAGES=2, CPS=16, TILED=True, DIRECT=True), **extra)
            ws = [fp4_mma.tile_prepared(q, cfg["NW"], 2) for q in cp] if cfg["NW"] != 1 else tiled
            rows.append((f"direct tiled st2 {extra}", ws, cfg))
        for name, ws, cfg in rows:
            if cfg is None:
                f = lambda q: fp4_launch.fp4_gemm(x, q)  # noqa: E731
            else:
                f = lambda q, c=cfg: fp4_mma.fp4_gemm_mma(x, q, config=c)  # noqa: E731
            try:
                err = ""
                if cfg is not None and not cfg.get("LOAD_ONLY"):
                    d = (f(ws[0]).float() - ref).abs().max().item()
                    err = f" max|diff| vs default {d:.2e} (|ref| max {ref.abs().max().item():.2e})"
                t_s, _ = time_calls([lambda q=q: f(q) for q in ws])
                print(f"{n}x{k} M={m} {name}: {t_s * 1e3:.1f} us {p.nbytes / t_s / 1e6:.0f} GB/s "
                      f"({100 * p.nbytes / t_s / 1e6 / ceil:.0f} %){err}", flush=True)
            except Exception as e:  # noqa: BLE001 - one failing variant must not end the probe
                print(f"{n}x{k} M={m} {name}: FAILED {type(e).__name__}: {str(e)[:300]}", flush=True)
    del cp, tiled
    torch.cuda.empty_cache()
