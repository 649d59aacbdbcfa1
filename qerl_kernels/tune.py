"""Sweep fused-GEMM kernel configs on chosen weight shapes and M values; print a table (developer tool).

Why: the autotuner only picks among `fp4_tuning._gemm_configs()`. This script times any config list (stream-K
grid multipliers, tile shapes, pipeline depths, warps) on real shapes so that list can be chosen from
measurements, and runs one config once for a profiler (`--one`, e.g. under `ncu`).

Run:  python -m qerl_kernels.tune --shapes 18944x3584 3584x3584 --m 1 16 64
      python -m qerl_kernels.tune --shapes 18944x3584 --m 1 --one 64,128,4,4,4   # BN,BK,warps,stages,CPS
      ncu --profile-from-start off ... python -m qerl_kernels.tune --shapes 37888x3584 --m 1 --profile
          (autotunes the forward and the backward kernel first, then brackets one call of each with
          cudaProfilerStart/Stop, so ncu sees exactly the two tuned kernels)
      python -m qerl_kernels.tune --gluon --shapes 37888x3584 3584x18944 --m 1 16   # the Gluon kernel's sweep
          (GLUON_SWEEP: rows per tile with warps, ring stages, CTAs per SM; --profile --gluon adds one Gluon call)
      python -m qerl_kernels.tune --wgmma --shapes 37888x3584 3584x18944 --m 64 256   # the wgmma kernel's sweep
          (WGMMA_SWEEP: consumer warps, largest M block, group columns, ring depths, wgmmas in flight; beside the
          default path and cuBLAS bf16)
      python -m qerl_kernels.tune --wgmma-t --shapes 18944x3584 3584x18944 --m 64 256   # the backward wgmma
          kernel's sweep (WGMMA_T_SWEEP: weight rows a step, largest M block, ring depths; beside the default
          backward path and cuBLAS bf16's grad_y @ W)
      python -m qerl_kernels.tune --mma --shapes 37888x3584 3584x18944 --m 1 8   # the decode-size MMA kernel's
          (MMA_SWEEP: warps a CTA, ring depth, programs per SM; beside the default path and cuBLAS bf16; --tiled
          adds MMA_TILED_SWEEP on tile-by-tile copies, --rows MMA_ROWS_SWEEP: the row-block grid's knob sets, or
          --rows-knobs KW=8,CPB=3,MAXNREG=96 ...; --rows-only: without the stream-K sweeps; --epilogue
          bias|lora: the engine's epilogue on every call; --passes 2: every set twice, the second time reversed)
      python -m qerl_kernels.tune --gemv --shapes 18944x3584 3584x18944 --m 1 16   # the skinny-M kernel's sweep
          (GEMV_SWEEP: mode, BN, BW, warps, stages, CTAs per SM; beside the default path and cuBLAS bf16, each
          timed on rotating weight copies as in the benchmark; prints the best knobs per shape and M)
"""
from __future__ import annotations

import argparse
import functools
import itertools
import sys

import torch

from qerl_kernels import fp4_launch, nvfp4
from qerl_kernels.bench import _clone_prepared, copies_for, time_calls
from qerl_kernels.reference import nvfp4_quantize_reference

DEFAULT_SWEEP = [  # BN, BK, num_warps, num_stages, CPS (grid = SMs * CPS; > resident CTAs means several waves)
    (bn, bk, nw, ns, cps)
    for (bn, bk, nw) in ((64, 128, 4), (128, 128, 8), (128, 128, 4), (64, 256, 4), (128, 256, 8))
    for ns in (3, 4, 6) for cps in (2, 4, 8)
    if not (bk == 256 and ns == 6)
]


GLUON_SWEEP = [  # BN, consumer warps, ring stages, CTAs per SM (fp4_gluon.fp4_gemm_gluon's knobs)
    (bn, nw, st, cps) for (bn, nw) in ((64, 4), (128, 8)) for st in (3, 4, 6) for cps in (1, 2, 3)
    if bn * cps <= 256]  # 8 consumer warps at 3 CTAs per SM would get 56 registers


# fp4_wgmma.fp4_gemm_wgmma's knobs: (num_warps, max_mp, ks, wstages, xstages); None = default_stages. Two warpgroups
# (BN 128) or one (BN 64); M blocks of 64 / 128 / 256 (256 spills in the sm_90 build: timed to see what the spills
# cost against decoding each weight tile once per 128 rows of x); wgmma groups of 64 or 128 columns; shallow and
# deep rings.
# fp4_wgmma_t.fp4_gemm_t_wgmma's knobs (the backward): (weight rows a step, largest M block, weight / g ring depths,
# two consumer partitions; None: the default, default_knobs / default_stages): the defaults first (ncu of the sweep's
# first launch reads them)
WGMMA_T_SWEEP = [(None, None, None, None, None), (128, 64, None, None, True), (64, 128, None, None, True),
                 (64, 64, None, None, True), (128, 32, None, None, True), (128, 64, None, None, False),
                 (64, 128, None, None, False), (64, 64, None, None, False)]
WGMMA_SWEEP = [(8, 128, 64, None, None, 1), (8, 128, 128, None, None, 1), (4, 128, 64, None, None, 1),
               (8, 64, 64, None, None, 1), (4, 256, 64, None, None, 1), (8, 256, 64, None, None, 1),
               (8, 128, 64, 3, 2, 1), (4, 64, 64, 8, 4, 1), (8, 128, 32, None, None, 1), (8, 256, 32, None, None, 1),
               (8, 128, 64, None, None, 2), (8, 128, 32, None, None, 2), (4, 128, 64, None, None, 2)]


# fp4_gemv.fp4_gemm_gemv's knobs: (BN, BW, num_warps, num_stages) per mode, each at 3 grid sizes (CTAs per SM the
# split aims at; the split is no compile-time constant, so these add no compiles). FMA (M <= 4): 1-4 rows per
# thread, 128-512 bytes of a row per k-step (55-168 registers in sm_90 builds); DOT (M > 4): 64- and 128-row
# tiles of 128 or 256 columns, 3-4 cp.async stages.
GEMV_SWEEP = {
    "fma": [(bn, bw, nw, 1) for bn, bw, nw in ((16, 32, 4), (16, 64, 4), (32, 64, 4), (32, 32, 4), (64, 64, 8),
                                                (32, 128, 4))],
    "dot": [(64, 32, 4, 3), (64, 16, 4, 4), (128, 16, 8, 3), (128, 32, 8, 3), (64, 64, 4, 2)],
}
GEMV_CPS = (3, 6, 12)
# fp4_mma.fp4_gemm_mma's knobs: (warps a CTA, 128-column chunks a unit, cp.async ring depth, programs an SM the
# persistent grid aims at, L2 prefetch distance in units; one compile per (NW, CH, STAGES, PF)): one wave at 96
# registers is 21 one-warp programs an SM
MMA_SWEEP = [(1, 2, 2, 16, 0), (1, 2, 2, 16, 2), (1, 2, 2, 16, 4), (1, 2, 2, 16, 8), (1, 2, 3, 16, 2),
             (2, 2, 2, 10, 2), (1, 1, 2, 16, 2), (1, 1, 2, 16, 4)]
# the same kernel on tile_prepared's copies (--tiled): ring depths and grids, the L2 prefetch
MMA_TILED_SWEEP = [(1, 2, 2, 16, 0), (1, 2, 3, 16, 0), (1, 2, 4, 16, 0), (1, 2, 2, 8, 0), (2, 2, 3, 10, 0),
                   (1, 2, 2, 16, 2), (1, 1, 2, 16, 0)]

# the row-block grid (--rows; config GRID "rows", persistent): knob sets of `fp4_mma.rows_launch_args` (KW warps a
# row block, CPB programs an SM, MAXNREG register cap, SPLIT runs a row block, PRE the LoRA epilogue, TILED the
# weight stored tile by tile); calls 64-75 (H100, M 1): fp4_mma.MEASURED_WINS' knobs are among these. --rows-knobs
# replaces the list ("KW=8,CPB=3,MAXNREG=96,PRE=2" ...)
MMA_ROWS_SWEEP = [dict(KW=2, CPB=12, MAXNREG=80), dict(KW=4, CPB=6, MAXNREG=80), dict(KW=8, CPB=3, MAXNREG=80),
                  dict(KW=8, CPB=3, MAXNREG=96), dict(KW=4, CPB=4, MAXNREG=96), dict(KW=8, CPB=2, MAXNREG=88),
                  dict(KW=4, SPLIT=2, CPB=6, MAXNREG=80), dict(KW=2, CPB=12, MAXNREG=80, TILED=1)]


def parse_knobs(text: str) -> dict:
    """"KW=8,CPB=3,MAXNREG=96" -> {"KW": 8, "CPB": 3, "MAXNREG": 96} (integers; the row-block grid's knob names).

    Raises:
        ValueError: an item that is not NAME=integer (names it).
    """
    out = {}
    for item in text.split(","):
        name, eq, value = item.partition("=")
        if not eq or not name.strip().isidentifier() or not value.strip().lstrip("-").isdigit():
            raise ValueError(f"tune: knob {item!r} of {text!r} is not NAME=integer (e.g. KW=8,CPB=3,MAXNREG=96)")
        out[name.strip().upper()] = int(value)
    return out


def parse_cfg(s: str):
    bn, bk, nw, ns, cps = (int(v) for v in s.split(","))
    return bn, bk, nw, ns, cps


def to_config(c, bm=16):
    bn, bk, nw, ns, cps = c
    return dict(STREAM_K=True, BM=bm, BN=bn, BK=bk, GROUP_M=1, CPS=cps, num_warps=nw, num_stages=ns)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", nargs="+", default=["18944x3584", "3584x18944", "3584x3584", "512x3584"])
    ap.add_argument("--m", nargs="+", type=int, default=[1, 16])
    ap.add_argument("--configs", nargs="*", default=None, help="BN,BK,warps,stages,CPS ...")
    ap.add_argument("--one", default=None, help="run this config once per shape/M (for a profiler)")
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp16"])
    ap.add_argument("--prewarm", type=int, default=0, help="compile the configs first in N processes")
    ap.add_argument("--path", default=None, choices=["swap", "tc", "deq"],
                    help="--profile: force this GEMM path (default: the dispatch's choice)")
    ap.add_argument("--profile", action="store_true", help="one tuned forward + backward call per shape/M, "
                    "between cudaProfilerStart/Stop (for ncu --profile-from-start off); with --gluon the Gluon kernel "
                    "at M <= 64, with --wgmma the wgmma kernel and bf16 cuBLAS at M > 16 too")
    ap.add_argument("--gluon", action="store_true", help="sweep GLUON_SWEEP for fp4_gluon.fp4_gemm_gluon instead")
    ap.add_argument("--gemv", action="store_true", help="sweep GEMV_SWEEP for fp4_gemv.fp4_gemm_gemv instead")
    ap.add_argument("--wgmma", action="store_true", help="sweep WGMMA_SWEEP for fp4_wgmma.fp4_gemm_wgmma instead")
    ap.add_argument("--wgmma-t", action="store_true", help="sweep WGMMA_T_SWEEP for the backward, "
                    "fp4_wgmma_t.fp4_gemm_t_wgmma (grad_y [M, N] @ W for each weight N x K of --shapes)")
    ap.add_argument("--mma", action="store_true", help="sweep MMA_SWEEP for fp4_mma.fp4_gemm_mma instead (with "
                    "--profile: one call of it at M <= 8 beside the default path's)")
    ap.add_argument("--tiled", action="store_true", help="--mma: also time MMA_TILED_SWEEP on the weight stored "
                    "tile by tile (fp4_mma.tile_prepared)")
    ap.add_argument("--rows", action="store_true", help="--mma: also time MMA_ROWS_SWEEP, the row-block grid "
                    "(GRID rows)")
    ap.add_argument("--rows-knobs", nargs="+", type=parse_knobs, default=None,
                    help="--rows: these knob sets instead of MMA_ROWS_SWEEP (KW=8,CPB=3,MAXNREG=96,PRE=2 ...)")
    ap.add_argument("--epilogue", default="none", choices=["none", "bias", "lora"],
                    help="--rows: every call (the default path's too) with a bias, or with the engine's LoRA update "
                    "(rank 32) and residual; errors then against the default path's output")
    ap.add_argument("--rows-only", action="store_true", help="--mma: the row-block grid alone (--rows without the "
                    "stream-K sweeps)")
    ap.add_argument("--passes", type=int, default=1, help="--rows: time every knob set this often, every second "
                    "pass in reverse order, the default path again after the last (the machine's drift shows)")
    ap.add_argument("--mma-config", default=None, help="--profile --mma: its knobs NW,CH,STAGES,CPS (default: the "
                    "heuristic's)")
    args = ap.parse_args(argv)
    if args.profile:
        return profile(args)
    if args.gluon:
        return sweep_gluon(args)
    if args.gemv:
        return sweep_gemv(args)
    if args.wgmma:
        return sweep_wgmma(args)
    if args.wgmma_t:
        return sweep_wgmma_t(args)
    if args.mma:
        return sweep_mma(args)
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float16
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    configs = [parse_cfg(c) for c in args.configs] if args.configs else DEFAULT_SWEEP
    if args.prewarm:
        import triton
        from qerl_kernels.prewarm import prewarm
        tc = []
        for c in configs:
            for bm in sorted({_bm(m) for m in args.m}):
                d = to_config(c, bm)
                nw, ns = d.pop("num_warps"), d.pop("num_stages")
                tc.append(triton.Config(d, num_warps=nw, num_stages=ns))
        print(f"prewarm {len(tc)} configs: {prewarm(args.prewarm, (False,), (dtype == torch.bfloat16,), tc, (0,), False):.0f} s",
              flush=True)
    results = []
    for shape in args.shapes:
        n, k = (int(v) for v in shape.split("x"))
        w = torch.randn(n, k, device="cuda") * 0.02
        p = nvfp4.prepare(*nvfp4_quantize_reference(w))
        w_bf = w.to(dtype)
        for m in args.m:
            x = torch.randn(m, k, device="cuda", dtype=dtype)
            if args.one:
                y = fp4_launch.fp4_gemm(x, p, config=to_config(parse_cfg(args.one), _bm(m)), fused=True)
                torch.cuda.synchronize()
                print(f"ran {args.one} on {shape} M={m}: {tuple(y.shape)}")
                continue
            bf_copies = [w_bf.clone() for _ in range(copies_for(n * k * 2, l2))]
            t_bf, _ = time_calls([lambda w=w: torch.nn.functional.linear(x, w) for w in bf_copies])
            del bf_copies
            copies = [_clone_prepared(p) for _ in range(copies_for(p.nbytes, l2))]
            ref = x.float() @ fp4_launch.fp4_dequantize(p, dtype).float().t()
            for c in configs:
                cfg = to_config(c, _bm(m))
                try:
                    y = fp4_launch.fp4_gemm(x, p, config=cfg, fused=True)
                    err = ((y.float() - ref).norm() / ref.norm()).item()
                    t, _ = time_calls([lambda q=q: fp4_launch.fp4_gemm(x, q, config=cfg, fused=True) for q in copies])
                except Exception as e:  # noqa: BLE001 - out of resources etc.
                    print(f"{shape} M={m} {c}: {type(e).__name__} {str(e)[:120]}", flush=True)
                    continue
                gbs = p.nbytes / t / 1e6
                results.append((shape, m, c, t, gbs, t_bf / t, err))
                print(f"{shape} M={m} cfg={c}: {t * 1e3:7.1f} us  {gbs:6.0f} GB/s  x{t_bf / t:.2f} bf16  "
                      f"err {err:.1e}", flush=True)
            del copies
    if results:
        print("\nbest per shape/M:")
        for (shape, m), grp in itertools.groupby(sorted(results, key=lambda r: (r[0], r[1], r[3])),
                                                 key=lambda r: (r[0], r[1])):
            grp = list(grp)
            print(f"  {shape} M={m}: " + "; ".join(f"{r[2]} {r[3] * 1e3:.1f}us x{r[5]:.2f}" for r in grp[:4]))
    return 0


def _sweep_weights(args, baselines: bool = True):
    """Per shape "NxK" of args.shapes: (shape, dtype, a seeded random NVFP4 weight, its rotating copies (more than L2
    holds, as the benchmark times them), and with `baselines` as many bf16 copies of the weight, else [])."""
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float16
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    for shape in args.shapes:
        n, k = (int(v) for v in shape.split("x"))
        w = torch.randn(n, k, device="cuda") * 0.02
        p = nvfp4.prepare(*nvfp4_quantize_reference(w))
        copies = [_clone_prepared(p) for _ in range(copies_for(p.nbytes, l2))]
        bf_copies = [w.to(dtype) for _ in range(copies_for(n * k * 2, l2))] if baselines else []
        del w
        yield shape, dtype, p, copies, bf_copies
        del copies, bf_copies


def _sweep_cases(args, baselines: bool = True):
    """The cases of a kernel's knob sweep, per shape of args.shapes and M of args.m: (shape, m, x, the NVFP4 weight, its
    rotating copies (more than L2 holds, as the benchmark times them), the float32 reference product, and with
    `baselines` cuBLAS bf16's and the default path's times (else None, None))."""
    for shape, dtype, p, copies, bf_copies in _sweep_weights(args, baselines):
        k = p.k
        for m in args.m:
            x = torch.randn(m, k, device="cuda", dtype=dtype)
            ref = x.float() @ fp4_launch.fp4_dequantize(p, dtype).float().t()
            t_bf = t_def = None
            if baselines:
                t_bf, _ = time_calls([lambda b=b: torch.nn.functional.linear(x, b) for b in bf_copies])
                t_def, _ = time_calls([lambda q=q: fp4_launch.fp4_gemm(x, q) for q in copies])
            yield shape, m, x, p, copies, ref, t_bf, t_def


def sweep_wgmma_t(args) -> int:
    """Time every WGMMA_T_SWEEP config of the backward wgmma kernel per weight shape and M beside cuBLAS bf16's
    backward (grad_y @ W) and the default backward path (fp4_gemm_t), all on rotating weight copies; print the best
    three per shape and M."""
    from qerl_kernels.fp4_wgmma_t import fp4_gemm_t_wgmma
    for shape, dtype, p, copies, bf_copies in _sweep_weights(args):
        for m in args.m:
            g = torch.randn(m, p.n, device="cuda", dtype=dtype)
            ref = g.float() @ fp4_launch.fp4_dequantize(p, dtype).float()
            t_bf, _ = time_calls([lambda b=b: g @ b for b in bf_copies])
            t_def, _ = time_calls([lambda q=q: fp4_launch.fp4_gemm_t(g, q) for q in copies])
            best = []
            for bnr, mp, ws, gs, split in WGMMA_T_SWEEP:
                kw = dict(bnr=bnr, max_mp=mp, wstages=ws, gstages=gs, split=split)
                if (res := _time_knobs(fp4_gemm_t_wgmma, g, p, copies, ref, kw, f"wgmma_t {shape} M={m}")) is None:
                    continue
                t, err = res
                best.append((t, bnr, mp, ws, gs, split))
                print(f"wgmma_t {shape} M={m} bnr={bnr} max_mp={mp} stages={ws}/{gs} split={split}: {t * 1e3:7.1f} us "
                      f"{2 * m * p.n * p.k / t / 1e9:6.0f} TFLOP/s {p.nbytes / t / 1e6:6.0f} GB/s x{t_bf / t:.2f} "
                      f"bf16 x{t_def / t:.2f} default err {err:.1e}", flush=True)
            _print_best(f"wgmma_t best {shape} M={m} (bnr, max_mp, wstages, gstages, split)", best,
                        f" | default {t_def * 1e3:.1f}us bf16 {t_bf * 1e3:.1f}us")
    return 0


def _time_knobs(kernel, x, p, copies, ref, knobs: dict, label: str):
    """(median time in ms, relative error) of kernel(x, weight, **knobs) on the rotating weight copies, or None after
    printing why it cannot run there (out of resources, knobs this shape rejects)."""
    try:
        y = kernel(x, p, **knobs)
        err = ((y.float() - ref).norm() / ref.norm()).item()
        t, _ = time_calls([lambda q=q: kernel(x, q, **knobs) for q in copies])
    except Exception as e:  # noqa: BLE001 - out of resources etc.
        print(f"{label} {knobs}: {type(e).__name__} {str(e)[:160]}", flush=True)
        return None
    return t, err


def _print_best(head: str, best: list[tuple], tail: str = "") -> None:
    """The sweep's summary line: `head`: the three fastest knob sets (seconds first in each tuple) and `tail`;
    nothing when no knob set ran."""
    if best:
        top = "; ".join(f"{c[1:]} {c[0] * 1e3:.1f}us" for c in sorted(best)[:3])
        print(f"{head}: {top}{tail}", flush=True)


def _sweep_run(kernel, x, p, ref, label: str, shape: str, m: int, t_bf: float, t_def: float, items, head: str,
               tail: str, extra: dict | None = None) -> None:
    """Time `kernel` at each (knob text, knob values, config, weight copies or a function giving them) of `items`
    on rotating copies beside the default path and cuBLAS bf16: a line each, then the best three (`head`: what
    names the values, `tail` after them); `extra`: further arguments of every call (an epilogue's)."""
    best = []
    for text, values, cfg, ws in items:
        ws = ws() if callable(ws) else ws
        if (res := _time_knobs(kernel, x, ws[0], ws, ref, {"config": cfg, **(extra or {})},
                               f"{label} {shape} M={m}")) is None:
            continue
        t, err = res
        best.append((t, *values))
        print(f"{label} {shape} M={m} {text}: {t * 1e3:7.1f} us {p.nbytes / t / 1e6:6.0f} GB/s x{t_bf / t:.2f} bf16 "
              f"x{t_def / t:.2f} default err {err:.1e}", flush=True)
    _print_best(f"{label} best {shape} M={m} {head}", best, tail)


def sweep_gluon(args) -> int:
    """Time every GLUON_SWEEP config of the Gluon kernel (rotating weight copies, as the benchmark) per shape and M."""
    from qerl_kernels.fp4_gluon import fp4_gemm_gluon
    for shape, m, x, p, copies, ref, _, _ in _sweep_cases(args, baselines=False):
        best = []
        for bn, nw, st, cps in GLUON_SWEEP:
            kw = dict(bn=bn, num_warps=nw, stages=st, ctas_per_sm=cps)
            if (res := _time_knobs(fp4_gemm_gluon, x, p, copies, ref, kw, f"gluon {shape} M={m}")) is None:
                continue
            t, err = res
            best.append((t, bn, nw, st, cps))
            print(f"gluon {shape} M={m} bn={bn} warps={nw} stages={st} ctas/SM={cps}: {t * 1e3:7.1f} us "
                  f"{p.nbytes / t / 1e6:6.0f} GB/s err {err:.1e}", flush=True)
        _print_best(f"gluon best {shape} M={m} (bn, warps, stages, ctas/SM)", best)
    return 0


def sweep_wgmma(args) -> int:
    """Time every WGMMA_SWEEP config of the wgmma kernel per shape and M beside cuBLAS bf16 and the default path,
    all on rotating weight copies (as the benchmark); print the best three per shape and M."""
    from qerl_kernels.fp4_wgmma import fp4_gemm_wgmma
    for shape, m, x, p, copies, ref, t_bf, t_def in _sweep_cases(args):
        best = []
        for nw, mp, ks, ws, xs, out in WGMMA_SWEEP:
            kw = dict(num_warps=nw, max_mp=mp, ks=ks, wstages=ws, xstages=xs, outstanding=out)
            if (res := _time_knobs(fp4_gemm_wgmma, x, p, copies, ref, kw, f"wgmma {shape} M={m}")) is None:
                continue
            t, err = res
            best.append((t, nw, mp, ks, ws, xs, out))
            print(f"wgmma {shape} M={m} warps={nw} max_mp={mp} ks={ks} stages={ws}/{xs} outstanding={out}: "
                  f"{t * 1e3:7.1f} us "
                  f"{2 * m * p.n * p.k / t / 1e9:6.0f} TFLOP/s {p.nbytes / t / 1e6:6.0f} GB/s x{t_bf / t:.2f} bf16 "
                  f"x{t_def / t:.2f} default err {err:.1e}", flush=True)
        _print_best(f"wgmma best {shape} M={m} (warps, max_mp, ks, wstages, xstages, outstanding)", best,
                    f" | default {t_def * 1e3:.1f}us bf16 {t_bf * 1e3:.1f}us")
    return 0


def sweep_gemv(args) -> int:
    """Time every GEMV_SWEEP config of the skinny-M kernel (FMA configs at M <= 4, DOT above) per shape and M,
    beside the default path (fp4_gemm, no path forced) and cuBLAS bf16, all on rotating weight copies."""
    from qerl_kernels.fp4_gemv import FMA_MAX_M, fp4_gemm_gemv
    for shape, m, x, p, copies, ref, t_bf, t_def in _sweep_cases(args):
        t_heur, _ = time_calls([lambda q=q: fp4_gemm_gemv(x, q) for q in copies])
        print(f"gemv {shape} M={m}: bf16 {t_bf * 1e3:.1f} us, default path {t_def * 1e3:.1f} us, gemv "
              f"heuristic {t_heur * 1e3:.1f} us ({p.nbytes / t_heur / 1e6:.0f} GB/s)", flush=True)
        mode = "fma" if m <= FMA_MAX_M else "dot"
        items = [(f"{mode} bn={bn} bw={bw} warps={nw} stages={ns} ctas/SM={cps}", (bn, bw, nw, ns, cps),
                  dict(DOT=mode == "dot", BN=bn, BW=bw, CPS=cps, num_warps=nw, num_stages=ns), copies)
                 for bn, bw, nw, ns in GEMV_SWEEP[mode] for cps in GEMV_CPS]
        _sweep_run(fp4_gemm_gemv, x, p, ref, "gemv", shape, m, t_bf, t_def, items,
                   f"{mode} (bn, bw, warps, stages, ctas/SM)",
                   f" | default {t_def * 1e3:.1f}us heuristic {t_heur * 1e3:.1f}us bf16 {t_bf * 1e3:.1f}us")
    return 0


def sweep_mma(args) -> int:
    """Time every MMA_SWEEP config of the decode-size MMA kernel per shape and M (<= 8), beside the default path
    and cuBLAS bf16, all on rotating weight copies; with --tiled also MMA_TILED_SWEEP on tile_prepared's copies."""
    from qerl_kernels.fp4_mma import fp4_gemm_mma, tile_prepared
    for shape, m, x, p, copies, ref, t_bf, t_def in _sweep_cases(args):
        t_heur, _ = time_calls([lambda q=q: fp4_gemm_mma(x, q) for q in copies])
        print(f"mma {shape} M={m}: bf16 {t_bf * 1e3:.1f} us, default path {t_def * 1e3:.1f} us, mma "
              f"heuristic {t_heur * 1e3:.1f} us ({p.nbytes / t_heur / 1e6:.0f} GB/s)", flush=True)
        tail = f" | default {t_def * 1e3:.1f}us heuristic {t_heur * 1e3:.1f}us bf16 {t_bf * 1e3:.1f}us"
        if getattr(args, "rows", False) or getattr(args, "rows_only", False):
            _sweep_rows(args, shape, m, x, p, copies, ref, t_bf, t_def, tail)
        runs = [] if getattr(args, "rows_only", False) else \
            [("mma", MMA_SWEEP, False)] + ([("mma-tiled", MMA_TILED_SWEEP, True)] if args.tiled else [])
        for label, sweep, tiled in runs:  # tiled: each unit one contiguous read (fp4_mma.tile_prepared)
            items = [(f"warps={nw} ch={ch} stages={st} ctas/SM={cps} pf={pf}", (nw, ch, st, cps, pf),
                      dict(NW=nw, CH=ch, STAGES=st, CPS=cps, PF=pf, TILED=tiled),
                      (lambda nw=nw, ch=ch: [tile_prepared(q, nw, ch) for q in copies]) if tiled else copies)
                     for nw, ch, st, cps, pf in sweep]
            _sweep_run(fp4_gemm_mma, x, p, ref, label, shape, m, t_bf, t_def, items,
                       "(warps, ch, stages, ctas/SM, prefetch)", tail)
    return 0


def _epilogue(kind: str, x: torch.Tensor, n: int) -> dict:
    """The arguments of the engine's epilogue on an [M, n] product: none, q/k/v's bias, or o's / down's LoRA update
    (rank 32, B with 0.02-scale entries) and residual."""
    g = torch.Generator(device=x.device).manual_seed(0)
    if kind == "bias":
        return dict(bias=torch.randn(n, device=x.device, generator=g).to(x.dtype))
    if kind == "lora":
        t = torch.randn(x.shape[0], 32, device=x.device, generator=g).to(x.dtype)
        b = (0.02 * torch.randn(n, 32, device=x.device, generator=g)).to(x.dtype)
        return dict(lora=(t, b), residual=torch.randn(x.shape[0], n, device=x.device, generator=g).to(x.dtype))
    return {}


def _sweep_rows(args, shape, m, x, p, copies, ref, t_bf, t_def, tail) -> None:
    """The row-block grid's knob sets (--rows-knobs or MMA_ROWS_SWEEP; TILED ones on tile_prepared's copies at NW 1,
    CH 2, made once) with --epilogue on every call (the default path's time and output then with it too), --passes
    times, every second pass in reverse order, the default path timed again after the last."""
    from qerl_kernels.fp4_mma import fp4_gemm_mma, tile_prepared
    epi = _epilogue(getattr(args, "epilogue", "none"), x, p.n)
    if epi:
        ref = fp4_launch.fp4_gemm(x, p, **epi).float()
        t_def, _ = time_calls([lambda q=q: fp4_launch.fp4_gemm(x, q, **epi) for q in copies])
    rows_tiled = functools.cache(lambda: [tile_prepared(q, 1, 2) for q in copies])
    knob_sets = getattr(args, "rows_knobs", None) or MMA_ROWS_SWEEP
    items = [(" ".join(f"{k}={v}" for k, v in kn.items()), tuple(kn.values()), dict(kn, GRID="rows"),
              rows_tiled if kn.get("TILED") else copies) for kn in knob_sets]
    passes = max(1, getattr(args, "passes", 1))
    for i in range(passes):
        _sweep_run(fp4_gemm_mma, x, p, ref, "mma-rows", shape, m, t_bf, t_def, items if i % 2 == 0 else items[::-1],
                   f"(knobs{', pass ' + str(i) if passes > 1 else ''})", tail, epi)
    if passes > 1:
        t_end, _ = time_calls([lambda q=q: fp4_launch.fp4_gemm(x, q, **epi) for q in copies])
        print(f"mma-rows {shape} M={m}: default path {t_def * 1e3:.1f} us first, {t_end * 1e3:.1f} us last",
              flush=True)


def profile(args) -> int:
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float16
    for shape in args.shapes:
        n, k = (int(v) for v in shape.split("x"))
        p = nvfp4.prepare(*nvfp4_quantize_reference(torch.randn(n, k, device="cuda") * 0.02))
        for m in args.m:
            x = torch.randn(m, k, device="cuda", dtype=dtype)
            g = torch.randn(m, n, device="cuda", dtype=dtype)
            path = args.path if m > 64 else None
            gluon = args.gluon and m <= 64
            wgmma = args.wgmma and m > 16
            mma = args.mma and m <= 8
            if mma:
                from qerl_kernels.fp4_mma import fp4_gemm_mma
                knobs = dict(zip(("NW", "CH", "STAGES", "CPS"), (int(v) for v in args.mma_config.split(",")))) \
                    if args.mma_config else None
            if gluon:
                from qerl_kernels.fp4_gluon import fp4_gemm_gluon
            if wgmma:  # the wgmma kernel beside bf16 cuBLAS on the dequantized weight (the ratio's baseline)
                from qerl_kernels.fp4_wgmma import fp4_gemm_wgmma
                wd = fp4_launch.fp4_dequantize(p, dtype)
            for _ in range(3):  # autotune + warm up
                fp4_launch.fp4_gemm(x, p, path=path)
                fp4_launch.fp4_gemm_t(g, p, path=path)
                if gluon:
                    fp4_gemm_gluon(x, p)
                if wgmma:
                    fp4_gemm_wgmma(x, p)
                    torch.nn.functional.linear(x, wd)
                if mma:
                    fp4_gemm_mma(x, p, config=knobs)
            torch.cuda.synchronize()
            torch.cuda.cudart().cudaProfilerStart()
            fp4_launch.fp4_gemm(x, p, path=path)
            fp4_launch.fp4_gemm_t(g, p, path=path)
            if gluon:
                fp4_gemm_gluon(x, p)
            if wgmma:
                fp4_gemm_wgmma(x, p)
                torch.nn.functional.linear(x, wd)
            if mma:
                fp4_gemm_mma(x, p, config=knobs)
            torch.cuda.synchronize()
            torch.cuda.cudart().cudaProfilerStop()
            print(f"profiled {shape} M={m}", flush=True)
    return 0


def _bm(m: int) -> int:
    return 16 if m <= 16 else 32 if m <= 32 else 64


if __name__ == "__main__":
    sys.exit(main())
