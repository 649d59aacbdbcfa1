"""Issue 22, call 58: (a) what a plain streaming read achieves on buffers of the 7B launches' sizes (rotating copies,
back-to-back launches as in a decode step), with and without programmatic dependent launch (PDL); (b) fp4_mma with
PDL (its first weight loads before it waits for the previous launch) against without, DIRECT and ring, beside the
default path. M = 1. Run: PYTHONPATH=$PWD python3 <this file>."""
import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from qerl_kernels import fp4_launch, fp4_mma, nvfp4
from qerl_kernels.bench import _clone_prepared, copies_for, read_ceiling, time_calls
from qerl_kernels.reference import nvfp4_quantize_reference


@triton.jit
def _read(x_ptr, out_ptr, n_blocks, BLOCK: tl.constexpr, PDL: tl.constexpr):
    if PDL:
        gdc_launch_dependents()
    pid = tl.program_id(0)
    acc = tl.zeros([BLOCK], dtype=tl.int32)
    offs = tl.arange(0, BLOCK)
    for i in range(pid, n_blocks, tl.num_programs(0)):
        acc += tl.load(x_ptr + i.to(tl.int64) * BLOCK + offs, cache_modifier=".cg")
    if PDL:
        gdc_wait()
    tl.store(out_ptr + pid, tl.sum(acc))


SM = torch.cuda.get_device_properties(0).multi_processor_count
L2 = torch.cuda.get_device_properties(0).L2_cache_size
ceil, parts = read_ceiling()
print(f"read ceiling {ceil:.0f} GB/s {parts}", flush=True)
SHAPES = [(37888, 3584), (3584, 18944), (3584, 3584), (4608, 3584)]
for n, k in SHAPES:
    p = nvfp4.prepare(*nvfp4_quantize_reference(torch.randn(n, k, device="cuda") * 0.02))
    nbytes = p.nbytes
    bufs = [torch.empty(nbytes // 4, dtype=torch.int32, device="cuda").random_() for _ in range(copies_for(nbytes, L2))]
    out = torch.empty(16 * SM, dtype=torch.int32, device="cuda")
    for block, warps, cps in ((8192, 8, 4), (4096, 8, 4), (2048, 4, 8), (8192, 8, 2), (1024, 4, 16)):
        nb = nbytes // 4 // block
        for pdl in (False, True):
            t_s, _ = time_calls([lambda b=b: _read[(min(cps * SM, nb),)](b, out, nb, BLOCK=block, PDL=pdl,
                                                                          num_warps=warps, launch_pdl=pdl)
                                 for b in bufs])
            print(f"{n}x{k} stream read {nb * block * 4 / 1e6:.1f} MB block={block} warps={warps} ctas/SM={cps} "
                  f"pdl={pdl}: {t_s * 1e3:.1f} us {nb * block * 4 / t_s / 1e6:.0f} GB/s "
                  f"({100 * nb * block * 4 / t_s / 1e6 / ceil:.0f} %)", flush=True)
    del bufs
    cp = [p] + [_clone_prepared(q) for q in [p] * (copies_for(nbytes, L2) - 1)]
    tiled = [fp4_mma.tile_prepared(q, 1, 2) for q in cp]
    tiled2 = [fp4_mma.tile_prepared(q, 2, 2) for q in cp]
    x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
    ref = fp4_launch.fp4_gemm(x, p).float()
    rows = [("default", cp, None)]
    for pdl in (False, True):
        rows += [(f"ring tiled st2 pdl={pdl}", tiled, dict(NW=1, CH=2, STAGES=2, CPS=16, TILED=True, PDL=pdl)),
                 (f"direct tiled st2 pdl={pdl}", tiled, dict(NW=1, CH=2, STAGES=2, CPS=16, TILED=True, DIRECT=True,
                                                            PDL=pdl)),
                 (f"direct tiled nw2 cps8 st2 pdl={pdl}", tiled2, dict(NW=2, CH=2, STAGES=2, CPS=8, TILED=True,
                                                                      DIRECT=True, PDL=pdl)),
                 (f"direct row-major st2 pdl={pdl}", cp, dict(NW=1, CH=2, STAGES=2, CPS=16, DIRECT=True, PDL=pdl)),
                 (f"direct tiled st1 load_only=2 pdl={pdl}", tiled, dict(NW=1, CH=2, STAGES=1, CPS=16, TILED=True,
                                                                        DIRECT=True, LOAD_ONLY=2, PDL=pdl))]
    for name, ws, cfg in rows:
        if cfg is None:
            f = lambda q: fp4_launch.fp4_gemm(x, q)  # noqa: E731
        else:
            f = lambda q, c=cfg: fp4_mma.fp4_gemm_mma(x, q, config=c)  # noqa: E731
        try:
            err = ""
            if cfg is not None and not cfg.get("LOAD_ONLY"):
                d = (f(ws[0]).float() - ref).abs().max().item()
                err = f" max|diff| vs default {d:.2e}"
            t_s, mode = time_calls([lambda q=q: f(q) for q in ws])
            print(f"{n}x{k} M=1 {name}: {t_s * 1e3:.1f} us {nbytes / t_s / 1e6:.0f} GB/s "
                  f"({100 * nbytes / t_s / 1e6 / ceil:.0f} %) [{mode}]{err}", flush=True)
        except Exception as e:  # noqa: BLE001 - one failing variant must not end the probe
            print(f"{n}x{k} M=1 {name}: FAILED {type(e).__name__}: {str(e)[:300]}", flush=True)
    del cp, tiled, tiled2
    torch.cuda.empty_cache()
