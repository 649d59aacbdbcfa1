"""Issue 22, call 60: fp4_mma's row-block grid (GRID "rows": a CTA a row block, its KW warps splitting the units,
their sums met in shared memory, SPLIT runs a row block through the workspace) against the default path and the
stream-K kernel's best (DIRECT, tiled), beside a plain streaming read of the same bytes; 7B shapes, M = 1 and 8.
Rows: us of one launch on rotating weight copies (bench.time_calls, CUDA graph), GB/s of weight bytes, % of the
read ceiling; full kernels checked against the default path. Run: PYTHONPATH=$PWD python3 <this file>."""
import torch
import triton
import triton.language as tl

from qerl_kernels import fp4_launch, fp4_mma, nvfp4
from qerl_kernels.bench import _clone_prepared, copies_for, read_ceiling, time_calls
from qerl_kernels.reference import nvfp4_quantize_reference


@triton.jit
def _read(x_ptr, out_ptr, n_blocks, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    acc = tl.zeros([BLOCK], dtype=tl.int32)
    offs = tl.arange(0, BLOCK)
    for i in range(pid, n_blocks, tl.num_programs(0)):
        acc += tl.load(x_ptr + i.to(tl.int64) * BLOCK + offs, cache_modifier=".cg")
    tl.store(out_ptr + pid, tl.sum(acc))


SM = torch.cuda.get_device_properties(0).multi_processor_count
L2 = torch.cuda.get_device_properties(0).L2_cache_size
ceil, _ = read_ceiling()
print(f"read ceiling {ceil:.0f} GB/s", flush=True)
SHAPES = [((37888, 3584), (1, 8), (1, 2, 4, 8)), ((3584, 18944), (1, 8), (2, 4, 8)), ((3584, 3584), (1,), (2, 4, 8)),
          ((4608, 3584), (1,), (2, 4, 8))]
for (n, k), ms, kws in SHAPES:
    p = nvfp4.prepare(*nvfp4_quantize_reference(torch.randn(n, k, device="cuda") * 0.02))
    nb = p.nbytes // 4 // 2048
    bufs = [torch.empty(nb * 2048, dtype=torch.int32, device="cuda") for _ in range(copies_for(p.nbytes, L2))]
    out = torch.empty(8 * SM, dtype=torch.int32, device="cuda")
    t_s, _ = time_calls([lambda b=b: _read[(min(8 * SM, nb),)](b, out, nb, BLOCK=2048, num_warps=4) for b in bufs])
    print(f"{n}x{k} stream read: {t_s * 1e3:.1f} us ({100 * p.nbytes / t_s / 1e6 / ceil:.0f} %)", flush=True)
    del bufs
    cp = [p] + [_clone_prepared(q) for q in [p] * (copies_for(p.nbytes, L2) - 1)]
    tiled = [fp4_mma.tile_prepared(q, 1, 2) for q in cp]
    for m in ms:
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        ref = fp4_launch.fp4_gemm(x, p).float()
        rows = [("default", cp, None),
                ("stream-K direct tiled st2", tiled, dict(NW=1, CH=2, STAGES=2, CPS=16, TILED=True, DIRECT=True)),
                ("rows heuristic", cp, dict(GRID="rows")), ("rows heuristic tiled", tiled, dict(GRID="rows", TILED=True))]
        for kw in kws:
            for split in ((1, 2) if n > 4608 else (1, 2, 4)):
                for t in (True, False):
                    rows.append((f"rows kw={kw} split={split} tiled={t}", tiled if t else cp,
                                 dict(GRID="rows", KW=kw, SPLIT=split, TILED=t)))
        if m == 1:
            for lo in (2, 1):
                rows.append((f"rows kw=4 split=1 tiled load_only={lo}", tiled,
                             dict(GRID="rows", KW=4, SPLIT=1, TILED=True, LOAD_ONLY=lo)))
            rows.append(("rows kw=4 split=1 tiled st1", tiled, dict(GRID="rows", KW=4, SPLIT=1, TILED=True, STAGES=1)))
        for name, ws, cfg in rows:
            if cfg is None:
                f = lambda q: fp4_launch.fp4_gemm(x, q)  # noqa: E731
            else:
                f = lambda q, c=cfg: fp4_mma.fp4_gemm_mma(x, q, config=c)  # noqa: E731
            try:
                err = ""
                if cfg is not None and not cfg.get("LOAD_ONLY"):
                    d = (f(ws[0]).float() - ref).abs().max().item()
                    err = f" max|diff| vs default {d:.2e} (|ref| {ref.abs().max().item():.1e})"
                t_s, mode = time_calls([lambda q=q: f(q) for q in ws])
                print(f"{n}x{k} M={m} {name}: {t_s * 1e3:.1f} us {p.nbytes / t_s / 1e6:.0f} GB/s "
                      f"({100 * p.nbytes / t_s / 1e6 / ceil:.0f} %) [{mode}]{err}", flush=True)
            except Exception as e:  # noqa: BLE001 - one failing variant must not end the probe
                print(f"{n}x{k} M={m} {name}: FAILED {type(e).__name__}: {str(e)[:300]}", flush=True)
    del cp, tiled
    torch.cuda.empty_cache()
