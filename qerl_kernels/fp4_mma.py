"""The decode-size (M <= 8) FP4 W4A16 forward on the tensor cores with register operands: y[M, N] = x[M, K] @ W^T
(+ bias) (+ t @ B^T) (+ residual), one `mma.sync` per decoded word pair (issue 22, item 4). Built, exact, and
a little faster than the default path at batch 1 on an H100 (the persistent row-block grid): the default dispatch
takes it for the launches of `MEASURED_WINS` (see "Measured" below).

Why it was built: at batch 1-8 the product is a weight stream. The main loop of the skinny-M kernel's FMA mode
(fp4_gemv, M = 1, 7B gate; its sm_90 SASS read offline, 2026-11-27) issues 51 instructions a 4-byte word of codes
(decode and scale ~28, bf16 -> fp32 conversions 8, FMUL / FFMA / FADD 12, loads and addresses ~3): 2.3 TB/s of
codes even at a perfect issue rate; it measured 1.5 TB/s (call 5). Here the decoder's packed pairs are the MMA's A
fragments as they come out of the registers, about 27-31 instructions a word:

1. The load-time layout (layout.prepare_codes) puts columns 32b + 8q + 2c + r of a 32-column block in word
   16t + 4c + b of a row, pair q in register h_q (fp4_decoder.decode_ptx). For lane (g = lane / 4, c = lane % 4)
   of an m16n8k16 MMA, the A fragment is rows g and g + 8 at columns 2c + r and 8 + 2c + r: exactly h0 and h1 of
   the lane's words of rows g and g + 8 (the next 16 columns: h2, h3). So a lane takes its rows' words b = 0..3
   (16 bytes a row), decodes each word into four registers and issues two MMAs a word pair, fp32 accumulators.
2. B is x^T: lane (g, c) holds activation row n = g at the same columns (four 4-byte pair loads a block, from L1),
   so M = 1..8 costs the same (lanes of rows >= M read row M - 1: their columns are never stored); D's lane (g, c)
   ends with rows g, g + 8 of W for activation rows 2c, 2c + 1.
3. A unit of work is CH 128-column chunks of a row block: CH 2 (the default where the chunks pair up) is one
   16-row tile a warp over 256 columns (each row's 128 contiguous bytes), CH 1 two tiles over 128 columns. A CTA
   has NW warps. The grid is persistent (stream-K): program p takes PER consecutive units of the (row block, unit)
   sequence, row block major, sized so that the programs fill the SMs in one wave. The words and scale entries
   stream through a STAGES-deep cp.async ring in shared memory, each thread copying the bytes it will read back
   itself (PF > 0 adds an L2 prefetch PF units ahead); the activations are loaded in the step.
4. A program's run that covers only part of a row block parks its partial sums in the shared workspace; the last
   part of a row block to arrive (gpu-scope acq_rel counter) sums them in program order and runs the epilogue:
   the per-row factor (out_scales), bias, the LoRA update t @ B^T (fp32 products over the rank, one rank at a
   time) and the residual. Deterministic, bit for bit from run to run.

The MMA crosses lanes, so the asm's operands must sit on the layout whose slot L of the [32 NW, 4] tensors is warp
L // 32, lane L % 32. Triton picks layouts itself (call 45: with one warp and the LoRA epilogue it put the asm on
threadsPerWarp [8, 4], and the results were wrong), so the GPU kernel (`_fp4_mma_gl`) is Gluon, which states every
layout; `check_layout` reads the asm's layout back from the compiled TTGIR (the offline build test asserts it).

Measured (H100, issue 22 calls 45-55, kernels.notes.md "Calls 45-55"; results/measured/h100/kernels/mma_call45/,
mma_calls46-55/): every benchmark check exact and repeatable, 27 GPU tests pass; 7B gate/up group at M = 1 45.0 us
at best against the default path's 39.3, down 26.0 vs 24.5, o 9.6 vs 10.3; the 7B rollout with it for every 4-bit
GEMM: QeRL 228.5 tok/s at batch 1 against 254.7 without it, 1,227 against 1,671 at batch 8. Halving the
instructions a word left the kernel at 1.5-1.8 TB/s, and every change that put more bytes in flight (deeper rings,
more warps, the L2 prefetch) made it slower. On a copy of the weight stored tile by tile (`tile_prepared`, call 52)
it reaches parity: gate/up 38.8 us, down 23.8 against 39.3 / 24.5. With LOAD_ONLY (the loads alone, call 54) it is
as slow as with the decode and MMAs; the weight stream alone through its cp.async ring (LOAD_ONLY 2, call 55)
reaches 2.14 TB/s, 69 % of the 3.12 a plain streaming read reaches.

Two load structures followed (calls 57-67, kernels.notes.md "Calls 57-67"; results/measured/h100/kernels/
direct_call57/ ... rows_call67/):
- DIRECT (words and scale entries loaded straight into registers, STAGES - 1 units ahead, no ring): the weight
  stream alone no faster (gate/up 35.1 us, 70 %), the whole kernel a little (gate/up 40.9 vs the ring's 41.4,
  down 23.1 vs 24.3, o 9.2 vs 9.6): the ring was not what capped the stream; the stream-K grid's run ends were.
- The row-block grid (`_fp4_mma_rows_gl`, config GRID "rows"): a CTA a row block, its KW warps splitting the row
  block's units, their sums met in shared memory, SPLIT runs a row block through the workspace. Its weight stream
  alone reaches a streaming read's rate (gate/up 29.8 us, 82 % of the ceiling; a Triton streaming read of the same
  bytes 27.5-32.8 us), with the activation loads 31.1; the whole kernel 39.4 (the default path 39.2): it is now
  issue-bound (ncu, call 61: 0.63 instructions issued a scheduler a cycle, 444 SASS instructions a 16-word unit,
  of which the decode and its scales ~21 a word, and ~30 % of all instructions in each program's set-up and
  epilogue). It wins on the small launches: o 7.4-7.7 us vs 9.6, q/k/v 9.0-9.3 vs 9.9 (call 60). Made persistent
  (program p takes row blocks p, p + P, ...: CPB programs an SM) with the registers capped at 80 (MAXNREG: 24 warps
  an SM fit; 4-32 bytes spilled outside the main loop) it also passes the default path on gate/up (call 64: 37.4 vs
  44.2 us, row-major; q/k/v 9.4 vs 11.6, o 7.8 vs 8.0), and down with 96 registers (call 66: 22.9 vs 24.5):
  `MEASURED_WINS`. In the 7B step with all four (call 67) the GEMMs take 2,357 us a step against 2,498, the graph
  step 3,810 vs 3,883 us (-1.9 %). M = 8: slower everywhere but 7B o (its activation loads stop being broadcasts;
  calls 72, 74).
- The epilogue's LoRA update split over the warps by rank (PRE, calls 68-69, kernels.notes.md "Calls 68-80"): o with
  the engine's LoRA and residual 12.6 -> 8.4 us, down 27.3 -> 24.3; the 7B step's GEMMs 2,151 us, the graph step
  3,604. The 14B / 32B launches where the grid wins (calls 70-71) are in the table too. Bound (ncu, call 74): 5.2
  warps a scheduler under the register cap, 44 % of a warp's cycles waiting on its loads; 28 fewer instructions a
  unit measured no faster (call 73).

CPU: TRITON_INTERPRET=1 runs `_fp4_mma`, the Triton twin of the same programs (no ring; `_twin_row` stands for the
asm: the decoded values times x summed over the lanes of each MMA, as the MMA does); the row-block grid's calls run
the twin over the stream-K grid (the same product).

Dispatch: fp4_launch.fp4_gemm takes this kernel for M <= MMA_MAX_M where `selected` says so: a committed
measurement (`MEASURED_WINS`, with its knobs), QERL_FP4_MMA=1 every eligible call, =0 never, or DEFAULT_ON (False:
the measurements above). Benchmark methods nvfp4_mma / mxfp4_mma (qerl_kernels.bench), knob sweep `python -m
qerl_kernels.tune --mma [--tiled] [--rows]`, offline build `python -m qerl_kernels.fp4_mma`, device call `bash
qerl_kernels/run_device.sh mma`.
"""
from __future__ import annotations

import os
import re

import torch

from qerl_kernels.fp4_decoder import HAVE_TRITON
from qerl_kernels.layout import PreparedFP4, interpret_mode

if HAVE_TRITON:
    import triton
    import triton.language as tl

    from qerl_kernels.fp4_decoder import _decode_words, decode_ptx
    from qerl_kernels.fp4_gemv import _pair_to_f32
    from qerl_kernels.fp4_gluon import HAVE_GLUON
    if HAVE_GLUON:
        from qerl_kernels.fp4_gluon import _cta_barrier
    from qerl_kernels.fp4_launch import _num_sms, _skinny_io, _workspace

    if HAVE_GLUON:
        from triton.experimental import gluon
        from triton.experimental.gluon import language as gl
        from triton.experimental.gluon.language.nvidia.ampere import async_copy

        # cp.async to shared memory: async_copy_global_to_shared in Triton 3.5-3.6, async_load later (same arguments)
        _cp_async = getattr(async_copy, "async_load", None) or async_copy.async_copy_global_to_shared
else:
    HAVE_GLUON = False

__all__ = ["fp4_gemm_mma", "launch_args", "mma_config", "rows_config", "rows_launch_args", "selected",
           "check_layout", "tile_prepared", "storage_strides", "MMA_MAX_M", "DEFAULT_ON", "MEASURED_WINS",
           "compile_variants", "compile_variant"]

MMA_MAX_M = 8        # the MMA's n = 8 columns are the activation rows
MAX_SPLIT = 16       # programs that may share a row block (the last one's sum of their parts)
DEFAULT_ON = False   # the default forward takes this kernel for M <= 8: no (calls 45-51: slower on the big launches)
# Committed GPU measurements where this kernel beats the default path (`selected`): (device key, scale_kind, dtype,
# N, K, M) -> knobs. Issue 22, H100, 2026-11-27 (one launch on rotating weight copies in a CUDA graph, the default
# path timed in the same call): call 60 (results/measured/h100/kernels/rows_call60/) found the row-block grid
# faster on the 7B o and q/k/v launches at batch 1; call 64 (rows_call64/: the grid persistent, registers capped at
# 80 so that 24 warps an SM fit) also on gate/up; call 66 (rows_call66/: programs an SM x register caps, every row
# timed twice) on down with 96 registers. Row-major weights (the load-time layout). Elsewhere the default path was
# as fast or faster (every M = 8 launch). Call 68 (epi_call68/: o and down with the engine's LoRA rank 32 and
# residual): the LoRA update split over the warps by rank (PRE) o 12.6 -> 8.4 us (PRE 1; 8.8 with PRE 2), down
# 27.3 -> 24.3 (PRE 2; 24.9 with PRE 1); without LoRA and residual 7.6 and 23.0. Call 71 (rollout_call71/): q/k/v
# with its bias 9.25 us at 4 warps / 4 programs an SM / 96 registers (call 70's 14B / 32B knobs), 9.37-9.47 with
# call 60's 4 / 6 / 80 (against 11.6 on the default path then). Call 73 (even_call73/): o with LoRA + residual
# 8.20 us at an 88-register cap against 8.44-8.49 at 80 (two programs an SM fit instead of three).
MEASURED_WINS: dict[tuple, dict] = {
    ("h100", 0, "bf16", 37888, 3584, 1): dict(GRID="rows", KW=2, SPLIT=1, CPB=12, MAXNREG=80),  # 37.4 vs 37.7-44.2
    ("h100", 0, "bf16", 3584, 18944, 1): dict(GRID="rows", KW=8, SPLIT=1, CPB=3, MAXNREG=96,    # down: 22.9 vs 24.5
                                              PRE=2),
    ("h100", 0, "bf16", 3584, 3584, 1): dict(GRID="rows", KW=8, SPLIT=1, CPB=3, MAXNREG=88),    # o: 7.8 vs 8.0
    ("h100", 0, "bf16", 4608, 3584, 1): dict(GRID="rows", KW=4, SPLIT=1, CPB=4, MAXNREG=96),    # q/k/v: 9.25 vs 9.4
    # M = 8 (call 72, rows_call72/): o with LoRA + residual 10.84 us vs 11.54-11.69; every other 7B launch at M = 8
    # slower on the grid (gate/up 57.6 vs 40.3, down 34.5 vs 27.2, q/k/v 12.4 vs 10.7: its activation loads)
    ("h100", 0, "bf16", 3584, 3584, 8): dict(GRID="rows", KW=8, SPLIT=1, CPB=3, MAXNREG=96),
    # M = 2 and 4 (call 84, rows_call84/, each with the engine's epilogue, the default path timed first and last):
    # o 8.7-8.8 / 9.1 us vs 11.1-11.2 / 11.6-11.7, q/k/v with bias 9.4 / 9.9-10.0 vs 12.0-12.1 / 12.0-12.1, down at
    # M = 2 26.0-26.1 vs 26.4-26.5; gate/up on the grid 39.5 vs 39.5-39.8 at M = 2 (a tie: left), 43.0 vs 39.9-40.1
    # at 4, down 28.0 vs 26.9-27.1 at 4 (default)
    ("h100", 0, "bf16", 3584, 3584, 2): dict(GRID="rows", KW=8, SPLIT=1, CPB=3, MAXNREG=88),
    ("h100", 0, "bf16", 3584, 3584, 4): dict(GRID="rows", KW=8, SPLIT=1, CPB=3, MAXNREG=88),
    ("h100", 0, "bf16", 4608, 3584, 2): dict(GRID="rows", KW=4, SPLIT=1, CPB=4, MAXNREG=96),
    ("h100", 0, "bf16", 4608, 3584, 4): dict(GRID="rows", KW=4, SPLIT=1, CPB=4, MAXNREG=96),
    ("h100", 0, "bf16", 3584, 18944, 2): dict(GRID="rows", KW=8, SPLIT=1, CPB=3, MAXNREG=96, PRE=2),
    # 14B / 32B (call 70, rows_call70/: with the engine's epilogues, the default path timed first and last), us:
    # q/k/v 13.3 vs 16.8, o 12.1 vs 14.8, 14B gate/up 39.8 vs 41.0-44.1, 14B down 25.5 vs 28.0, 32B gate/up 68.7
    # vs 72.0-79.0; 32B's down (5120 x 27648) stays on the default path (42.5 against the grid's best 46.2)
    ("h100", 0, "bf16", 7168, 5120, 1): dict(GRID="rows", KW=4, SPLIT=1, CPB=4, MAXNREG=96),
    ("h100", 0, "bf16", 5120, 5120, 1): dict(GRID="rows", KW=4, SPLIT=1, CPB=4, MAXNREG=96),
    ("h100", 0, "bf16", 27648, 5120, 1): dict(GRID="rows", KW=4, SPLIT=1, CPB=6, MAXNREG=80),
    ("h100", 0, "bf16", 5120, 13824, 1): dict(GRID="rows", KW=4, SPLIT=1, CPB=4, MAXNREG=96),
    ("h100", 0, "bf16", 55296, 5120, 1): dict(GRID="rows", KW=4, SPLIT=1, CPB=6, MAXNREG=80),
}
_LAYOUT = re.compile(r"sizePerThread = \[1, 4\], threadsPerWarp = \[32, 1\], warpsPerCTA = \[(\d+), 1\], "
                     r"order = \[1, 0\]")


def _mma_asm(scale_kind: int, bf16: bool, ch: int = 1) -> str:
    """PTX of one element: four words and their scale entries decoded to A fragments, x's pairs as B, two m16n8k16
    MMAs per (16-row tile, 32-column block).

    ch 1 (one 128-column chunk a unit, two tiles): words of rows g, g+8, g+16, g+24 ($8-$11), scale entries
    ($12-$15), x's pairs q = 0..3 ($16-$19); $0-$3 = $20-$23 + rows (g, g+8) x (n 2c, 2c+1) of the block's
    product, $4-$7 = $24-$27 + rows (g+16, g+24).
    ch 2 (two consecutive chunks a unit, one tile: 128 contiguous bytes of each row a unit): words of rows g, g+8
    in chunk 0, then in chunk 1 ($4-$7), scale entries ($8-$11), x's pairs q = 0..3 of chunk 0, then of chunk 1
    ($12-$19); $0-$3 = $20-$23 + rows (g, g+8) x (n 2c, 2c+1) of both blocks' products."""
    ty = "bf16" if bf16 else "f16"
    mma = f"mma.sync.aligned.m16n8k16.row.col.f32.{ty}.{ty}.f32"
    w0, s0, x0 = (8, 12, 16) if ch == 1 else (4, 8, 12)
    decls, body = [], []
    for i in range(4):
        d, b = decode_ptx(scale_kind, bf16, f"${w0 + i}", f"${s0 + i}", f"_{i}")
        decls.append(d)
        body.append(b)
    # (words u, v: the tile's two rows; x pairs from operand xq; accumulator in; result out)
    if ch == 1:
        plan = [(0, 1, x0, [f"${20 + k}" for k in range(4)], [f"${k}" for k in range(4)]),
                (2, 3, x0, [f"${24 + k}" for k in range(4)], [f"${4 + k}" for k in range(4)])]
    else:
        mid = [f"q{k}" for k in range(4)]
        plan = [(0, 1, x0, [f"${20 + k}" for k in range(4)], mid),
                (2, 3, x0 + 4, mid, [f"${k}" for k in range(4)])]
    for u, v, xq, acc, out in plan:
        body.append(f"{mma} {{p0, p1, p2, p3}}, {{h0_{u}, h0_{v}, h1_{u}, h1_{v}}}, {{${xq}, ${xq + 1}}}, "
                    f"{{{', '.join(acc)}}};\n"
                    f"{mma} {{{', '.join(out)}}}, {{h2_{u}, h2_{v}, h3_{u}, h3_{v}}}, {{${xq + 2}, ${xq + 3}}}, "
                    f"{{p0, p1, p2, p3}};\n")
    return "{\n" + "".join(decls) + ".reg .f32 p0, p1, p2, p3, q0, q1, q2, q3;\n" + "".join(body) + "}"


def _constraints(ch: int) -> str:
    """The asm's operand constraints: outputs (fp32), words, scale entries (16 bits), x's pairs, accumulators."""
    if ch == 1:
        return ",".join(["=f"] * 8 + ["r"] * 4 + ["h"] * 4 + ["r"] * 4 + ["f"] * 8)
    return ",".join(["=f"] * 4 + ["r"] * 4 + ["h"] * 4 + ["r"] * 8 + ["f"] * 4)


if HAVE_TRITON:
    @triton.jit
    def _outer(o, v, NW: tl.constexpr):
        """[NW, 8 (weight lane row), 8 (activation row), 4 (c), 4 (b)]: o (weights of lane (g, c)) times v (x of
        lane (n, c))."""
        return tl.reshape(o.to(tl.float32), [NW, 8, 1, 4, 4]) * tl.reshape(v, [NW, 1, 8, 4, 4])

    @triton.jit
    def _twin_row(w, s, v0, v1, v2, v3, v4, v5, v6, v7, SCALE_KIND: tl.constexpr, BF16: tl.constexpr,
                  NW: tl.constexpr):
        """The MMAs' result for one weight row per lane (interpreter path): lane (g, c) gets the row's dot
        products with activation rows 2c and 2c + 1 over the block's 32 columns (all four lanes' words)."""
        o0, o1, o2, o3, o4, o5, o6, o7 = _decode_words(w, s, SCALE_KIND, BF16, False)
        p = _outer(o0, v0, NW) + _outer(o1, v1, NW) + _outer(o2, v2, NW) + _outer(o3, v3, NW)
        p += _outer(o4, v4, NW) + _outer(o5, v5, NW) + _outer(o6, v6, NW) + _outer(o7, v7, NW)
        d = tl.reshape(tl.sum(p, axis=3), [NW, 8, 4, 2, 4])     # [warp, g, c, j, b]: activation row 2c + j
        d_even, d_odd = tl.split(tl.permute(d, (0, 1, 2, 4, 3)))
        return tl.reshape(d_even, [32 * NW, 4]), tl.reshape(d_odd, [32 * NW, 4])

    @triton.jit
    def _mma_step(w0, w1, w2, w3, s0, s1, s2, s3, x0, x1, x2, x3, a0, a1, a2, a3, a4, a5, a6, a7,
                  SCALE_KIND: tl.constexpr, BF16: tl.constexpr, NW: tl.constexpr):
        """One 128-column step of one element (4 weight rows of a lane x its 4 words each), the interpreter's
        stand-in for `_mma_asm`: accumulators + the block's products, in the asm's output order."""
        v0, v1 = _pair_to_f32(x0, BF16)
        v2, v3 = _pair_to_f32(x1, BF16)
        v4, v5 = _pair_to_f32(x2, BF16)
        v6, v7 = _pair_to_f32(x3, BF16)
        e0, d0 = _twin_row(w0, s0, v0, v1, v2, v3, v4, v5, v6, v7, SCALE_KIND, BF16, NW)
        e1, d1 = _twin_row(w1, s1, v0, v1, v2, v3, v4, v5, v6, v7, SCALE_KIND, BF16, NW)
        e2, d2 = _twin_row(w2, s2, v0, v1, v2, v3, v4, v5, v6, v7, SCALE_KIND, BF16, NW)
        e3, d3 = _twin_row(w3, s3, v0, v1, v2, v3, v4, v5, v6, v7, SCALE_KIND, BF16, NW)
        return a0 + e0, a1 + d0, a2 + e1, a3 + d1, a4 + e2, a5 + d2, a6 + e3, a7 + d3

    @triton.jit
    def _mma_step2(w0, w1, w2, w3, s0, s1, s2, s3, x0, x1, x2, x3, x4, x5, x6, x7, a0, a1, a2, a3,
                   SCALE_KIND: tl.constexpr, BF16: tl.constexpr, NW: tl.constexpr):
        """`_mma_step` for two chunks a unit (the asm's ch 2): rows g, g + 8 of one tile over both chunks."""
        v0, v1 = _pair_to_f32(x0, BF16)
        v2, v3 = _pair_to_f32(x1, BF16)
        v4, v5 = _pair_to_f32(x2, BF16)
        v6, v7 = _pair_to_f32(x3, BF16)
        e0, d0 = _twin_row(w0, s0, v0, v1, v2, v3, v4, v5, v6, v7, SCALE_KIND, BF16, NW)
        e1, d1 = _twin_row(w1, s1, v0, v1, v2, v3, v4, v5, v6, v7, SCALE_KIND, BF16, NW)
        v0, v1 = _pair_to_f32(x4, BF16)
        v2, v3 = _pair_to_f32(x5, BF16)
        v4, v5 = _pair_to_f32(x6, BF16)
        v6, v7 = _pair_to_f32(x7, BF16)
        e2, d2 = _twin_row(w2, s2, v0, v1, v2, v3, v4, v5, v6, v7, SCALE_KIND, BF16, NW)
        e3, d3 = _twin_row(w3, s3, v0, v1, v2, v3, v4, v5, v6, v7, SCALE_KIND, BF16, NW)
        return a0 + (e0 + e2), a1 + (d0 + d2), a2 + (e1 + e3), a3 + (d1 + d3)

    @triton.jit
    def _x_twin(xp, kk, x_ok, xk, kp, EVEN_K: tl.constexpr):
        """Chunk kk's activation pairs q = 0..3 (masked: rows >= M, and past K)."""
        if EVEN_K:
            x0 = tl.load(xp + 64 * kk, mask=x_ok, other=0)
            x1 = tl.load(xp + 64 * kk + 4, mask=x_ok, other=0)
            x2 = tl.load(xp + 64 * kk + 8, mask=x_ok, other=0)
            x3 = tl.load(xp + 64 * kk + 12, mask=x_ok, other=0)
        else:
            x0 = tl.load(xp + 64 * kk, mask=x_ok & (xk + 64 * kk < kp), other=0)
            x1 = tl.load(xp + 64 * kk + 4, mask=x_ok & (xk + 64 * kk + 4 < kp), other=0)
            x2 = tl.load(xp + 64 * kk + 8, mask=x_ok & (xk + 64 * kk + 8 < kp), other=0)
            x3 = tl.load(xp + 64 * kk + 12, mask=x_ok & (xk + 64 * kk + 12 < kp), other=0)
        return x0, x1, x2, x3

    @triton.jit
    def _mma_out(q, row, c, blk: tl.constexpr, os_ptr, bias_ptr, y_ptr, t_ptr, lb_ptr, res_ptr, M, N, stride_ym,
                 stride_t, stride_res, HAS_BIAS: tl.constexpr, HAS_LORA: tl.constexpr, R: tl.constexpr,
                 HAS_RES: tl.constexpr):
        """Results q [32 NW, 4] of 16-row tile `blk`: q[L, 2h + j] is weight row row + 16 blk + 8 h, activation row
        2c + j. y[n, rows] = q * factor[rows] (+ bias) (+ t[n] . B[rows]) (+ residual[n, rows]) where n < M and
        rows < N."""
        i = tl.arange(0, 4)
        rows = row[:, None] + 16 * blk + 8 * (i // 2)[None, :]
        n = 2 * c[:, None] + (i % 2)[None, :]
        ok = (n < M) & (rows < N)
        out = q * tl.load(os_ptr + rows, mask=rows < N, other=0.0)
        if HAS_BIAS:
            out += tl.load(bias_ptr + rows, mask=rows < N, other=0.0).to(tl.float32)
        if HAS_LORA:
            rr = tl.arange(0, R)[None, None, :]
            bt = tl.load(lb_ptr + rows[:, :, None] * R + rr, mask=ok[:, :, None], other=0.0)
            tt = tl.load(t_ptr + n[:, :, None] * stride_t + rr, mask=ok[:, :, None], other=0.0)
            out += tl.sum(bt.to(tl.float32) * tt.to(tl.float32), axis=2)
        if HAS_RES:
            out += tl.load(res_ptr + n * stride_res + rows, mask=ok, other=0.0).to(tl.float32)
        tl.store(y_ptr + n * stride_ym + rows, out.to(y_ptr.dtype.element_ty), mask=ok)

    @triton.jit
    def _quad(a0, a1, a2, a3):
        """Four [32 NW, 4] accumulators summed over their words -> [32 NW, 4] (column i from a_i; join appends the
        new dimension last, so [L, 2, 2] is indexed [L, i // 2, i % 2] by joining (a0, a2) and (a1, a3))."""
        return tl.reshape(tl.join(tl.join(tl.sum(a0, axis=1), tl.sum(a2, axis=1)),
                                  tl.join(tl.sum(a1, axis=1), tl.sum(a3, axis=1))), [a0.shape[0], 4])

    @triton.jit
    def _run_end(a0, a1, a2, a3, a4, a5, a6, a7, u, u0, pid, per, steps, L, c, rbase,
                 os_row, bias_ptr, y_ptr, ws_ptr, cnt_ptr, t_ptr, lb_ptr, res_ptr, M, N, stride_ym, stride_t,
                 stride_res, HAS_BIAS: tl.constexpr, HAS_LORA: tl.constexpr, R: tl.constexpr, HAS_RES: tl.constexpr,
                 NW: tl.constexpr, MAX_PARTS: tl.constexpr, TILES: tl.constexpr):
        """The end of this program's run over row block u // steps (its last step, or the program's last unit):
        the whole block -> the epilogue; a part -> park it (slot 2 pid + (0: the program's first run, 1: its last)),
        and the block's last part to arrive sums the parts in program order and runs the epilogue. TILES: 16-row
        tiles a warp (a4-a7 are the second's)."""
        blk = u // steps
        row = blk * (16 * TILES * NW) + rbase
        q0 = _quad(a0, a1, a2, a3)
        q1 = _quad(a4, a5, a6, a7)
        first = blk * steps
        if (first >= u0) & (u == first + steps - 1):
            _mma_out(q0, row, c, 0, os_row, bias_ptr, y_ptr, t_ptr, lb_ptr, res_ptr, M, N, stride_ym, stride_t,
                     stride_res, HAS_BIAS, HAS_LORA, R, HAS_RES)
            if TILES == 2:
                _mma_out(q1, row, c, 1, os_row, bias_ptr, y_ptr, t_ptr, lb_ptr, res_ptr, M, N, stride_ym,
                         stride_t, stride_res, HAS_BIAS, HAS_LORA, R, HAS_RES)
        else:
            q_off = L[:, None] * 4 + tl.arange(0, 4)[None, :]
            part = 2 * 32 * NW * 4
            slot = 2 * pid + (blk != u0 // steps).to(tl.int32)
            tl.store(ws_ptr + slot * part + q_off, q0)
            tl.store(ws_ptr + slot * part + 32 * NW * 4 + q_off, q1)
            tl.debug_barrier()  # every thread's stores precede the one arrival (release is cumulative)
            p0 = first // per
            p1 = (first + steps - 1) // per
            arrived = tl.atomic_add(cnt_ptr + blk, 1, sem="acq_rel", scope="gpu")
            if arrived == p1 - p0:
                t0 = tl.zeros([32 * NW, 4], dtype=tl.float32)
                t1 = tl.zeros([32 * NW, 4], dtype=tl.float32)
                for i in tl.static_range(MAX_PARTS):
                    pp = p0 + i
                    sl = 2 * pp + (blk != (pp * per) // steps).to(tl.int32)
                    live = q_off * 0 + pp <= p1
                    t0 += tl.load(ws_ptr + sl * part + q_off, mask=live, other=0.0, cache_modifier=".cg")
                    t1 += tl.load(ws_ptr + sl * part + 32 * NW * 4 + q_off, mask=live, other=0.0,
                                  cache_modifier=".cg")
                _mma_out(t0, row, c, 0, os_row, bias_ptr, y_ptr, t_ptr, lb_ptr, res_ptr, M, N, stride_ym,
                         stride_t, stride_res, HAS_BIAS, HAS_LORA, R, HAS_RES)
                if TILES == 2:
                    _mma_out(t1, row, c, 1, os_row, bias_ptr, y_ptr, t_ptr, lb_ptr, res_ptr, M, N, stride_ym,
                             stride_t, stride_res, HAS_BIAS, HAS_LORA, R, HAS_RES)
                tl.atomic_xchg(cnt_ptr + blk, 0)

    @triton.jit(do_not_specialize=["M"])
    def _fp4_mma(
            # pointers (x32: the activations as int32 pairs)
            x32_ptr, w_ptr, s_ptr, os_ptr, bias_ptr, y_ptr, ws_ptr, cnt_ptr, t_ptr, lb_ptr, res_ptr,
            # sizes: KWW = padded K in words (a multiple of 16); TOTAL = row blocks x steps, PER units a program
            M, N, K, KWW, TOTAL, PER,
            # strides (elements; stride_x32 in int32 pairs)
            stride_x32, stride_ym, stride_os, stride_t, stride_res,
            # where the codes and scale entries sit (elements; `storage_strides`): a row's, a unit's, a row block's
            WROW, SROW, WUNIT, SUNIT, WBLK, SBLK,
            # meta
            SCALE_KIND: tl.constexpr, BF16: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_LORA: tl.constexpr,
            R: tl.constexpr, HAS_RES: tl.constexpr, EVEN_K: tl.constexpr, NW: tl.constexpr, MAX_PARTS: tl.constexpr,
            STAGES: tl.constexpr, CH: tl.constexpr, PF: tl.constexpr = 0, LOAD_ONLY: tl.constexpr = 0,
            DIRECT: tl.constexpr = 0):
        """The interpreter's kernel (the GPU runs `_fp4_mma_gl`, the same programs with the asm's operand layout
        pinned and a cp.async ring): program pid takes units [pid PER, (pid + 1) PER) of the (row block, step of CH
        128-column chunks) sequence, row block major; STAGES, PF, DIRECT: the GPU kernel's ring depth (or register
        prefetch depth), L2 prefetch distance and load mode (unused here)."""
        TILES: tl.constexpr = 2 // CH
        ROWS: tl.constexpr = 4 // CH        # rows of a lane a chunk: g + 8 h, h < ROWS
        pid = tl.program_id(0)
        steps = KWW // (16 * CH)
        u0 = pid * PER
        u1 = tl.minimum(u0 + PER, TOTAL)
        L = tl.arange(0, 32 * NW)
        g = (L % 32) // 4
        c = L % 4
        rbase = (L // 32) * (16 * TILES) + g      # a lane's rows in its block: rbase + 8 h
        rb = tl.arange(0, 4)
        roww, rows_, wst, sst, wblk, sblk = WROW, SROW, WUNIT, SUNIT, WBLK, SBLK
        wp = w_ptr + rbase[:, None] * roww + (4 * c)[:, None] + rb[None, :]
        sp = s_ptr + rbase[:, None] * rows_ + rb[None, :]
        xp = x32_ptr + g[:, None] * stride_x32 + c[:, None] + 16 * rb[None, :]
        xk = c[:, None] + 16 * rb[None, :]                  # pair index in the chunk, q = 0 (q adds 4 q)
        x_ok = (g < M)[:, None]
        w8 = 8 * roww
        s8 = 8 * rows_
        kp = K // 2
        os_row = os_ptr + BF16 * stride_os
        a0 = tl.zeros([32 * NW, 4], dtype=tl.float32)
        a1 = tl.zeros([32 * NW, 4], dtype=tl.float32)
        a2 = tl.zeros([32 * NW, 4], dtype=tl.float32)
        a3 = tl.zeros([32 * NW, 4], dtype=tl.float32)
        a4 = tl.zeros([32 * NW, 4], dtype=tl.float32)
        a5 = tl.zeros([32 * NW, 4], dtype=tl.float32)
        a6 = tl.zeros([32 * NW, 4], dtype=tl.float32)
        a7 = tl.zeros([32 * NW, 4], dtype=tl.float32)
        for u in range(u0, u1):
            blk = u // steps
            st = u - blk * steps
            # the unit at blk * wblk + st * wst; word i at row offset 8 (i % ROWS), chunk i // ROWS of the unit
            wu = wp + blk * wblk + st * wst
            su = sp + blk * sblk + st * sst
            w0 = tl.load(wu)
            w1 = tl.load(wu + (1 % ROWS) * w8 + 16 * (1 // ROWS))
            w2 = tl.load(wu + (2 % ROWS) * w8 + 16 * (2 // ROWS))
            w3 = tl.load(wu + (3 % ROWS) * w8 + 16 * (3 // ROWS))
            s0 = tl.load(su).to(tl.int16)
            s1 = tl.load(su + (1 % ROWS) * s8 + 4 * (1 // ROWS)).to(tl.int16)
            s2 = tl.load(su + (2 % ROWS) * s8 + 4 * (2 // ROWS)).to(tl.int16)
            s3 = tl.load(su + (3 % ROWS) * s8 + 4 * (3 // ROWS)).to(tl.int16)
            x0, x1, x2, x3 = _x_twin(xp, CH * st, x_ok, xk, kp, EVEN_K)
            if LOAD_ONLY:  # as the GPU kernel's diagnostic: the loads, no decode and no MMA (the output is not y)
                a0 += (w0 ^ w1 ^ w2 ^ w3 ^ x0 ^ x1 ^ x2 ^ x3 ^ (s0 ^ s1 ^ s2 ^ s3).to(tl.int32)).to(tl.float32)
            elif CH == 1:
                a0, a1, a2, a3, a4, a5, a6, a7 = _mma_step(w0, w1, w2, w3, s0, s1, s2, s3, x0, x1, x2, x3,
                                                           a0, a1, a2, a3, a4, a5, a6, a7, SCALE_KIND, BF16, NW)
            else:
                x4, x5, x6, x7 = _x_twin(xp, CH * st + 1, x_ok, xk, kp, EVEN_K)
                a0, a1, a2, a3 = _mma_step2(w0, w1, w2, w3, s0, s1, s2, s3, x0, x1, x2, x3, x4, x5, x6, x7,
                                            a0, a1, a2, a3, SCALE_KIND, BF16, NW)
            if (st == steps - 1) | (u == u1 - 1):
                _run_end(a0, a1, a2, a3, a4, a5, a6, a7, u, u0, pid, PER, steps, L, c, rbase, os_row, bias_ptr,
                         y_ptr, ws_ptr, cnt_ptr, t_ptr, lb_ptr, res_ptr, M, N, stride_ym, stride_t, stride_res,
                         HAS_BIAS, HAS_LORA, R, HAS_RES, NW, MAX_PARTS, TILES)
                a0 = tl.zeros([32 * NW, 4], dtype=tl.float32)
                a1 = tl.zeros([32 * NW, 4], dtype=tl.float32)
                a2 = tl.zeros([32 * NW, 4], dtype=tl.float32)
                a3 = tl.zeros([32 * NW, 4], dtype=tl.float32)
                a4 = tl.zeros([32 * NW, 4], dtype=tl.float32)
                a5 = tl.zeros([32 * NW, 4], dtype=tl.float32)
                a6 = tl.zeros([32 * NW, 4], dtype=tl.float32)
                a7 = tl.zeros([32 * NW, 4], dtype=tl.float32)


if HAVE_GLUON:
    # `_mma_asm`'s PTX for every (format, dtype, unit), index 4 SCALE_KIND + 2 BF16 + CH - 1, and the constraints
    # by CH - 1
    _G_ASM = gl.constexpr(tuple(_mma_asm(k, b, ch) for k in (0, 1) for b in (False, True) for ch in (1, 2)))
    _G_CONSTRAINTS = gl.constexpr((_constraints(1), _constraints(2)))

    @gluon.jit
    def _gl_issue(w_ring, s_ring, wp, sp, w8, s8, wblk, sblk, wst, sst, uu, steps, slot, CH: gl.constexpr):
        """cp.async of unit uu's words and scale entries (row block uu // steps, step uu % steps: the unit at
        blk * wblk + step * wst, its word i at row offset 8 (i % (4 // CH)) and chunk i // (4 // CH); each thread its
        own 16 / 8 / 4 bytes a row, read back by the same thread) into ring slot `slot`, as one commit group."""
        blk = uu // steps
        st = uu - blk * steps
        for i in gl.static_range(4):
            _cp_async(w_ring.index(slot * 4 + i), wp + (blk * wblk + st * wst + (i % (4 // CH)) * w8 +
                                                        16 * (i // (4 // CH))))
            _cp_async(s_ring.index(slot * 4 + i), sp + (blk * sblk + st * sst + (i % (4 // CH)) * s8 +
                                                        4 * (i // (4 // CH))))
        async_copy.commit_group()

    @gluon.jit
    def _gl_ldcg(p, ok):
        """A global load that bypasses L1 (.cg, as a streaming read's do), masked to 0 by ok unless ok is None."""
        if ok is None:
            v = gl.load(p, cache_modifier=".cg")
        else:
            v = gl.load(p, mask=ok, other=0, cache_modifier=".cg")
        return v

    @gluon.jit
    def _gl_wload_at(wb, sb, w8, s8, ok, CH: gl.constexpr):
        """A unit's words and scale entries straight into registers (DIRECT, and the row-block grid): the bytes
        `_gl_issue` copies, as 16-byte (words) and 4- or 8-byte (entries) loads from the unit's bases wb / sb (the
        row-block grid: per-slot [32 KW, 1] bases, masked by ok: zero words, no product)."""
        r4: gl.constexpr = 4 // CH
        w0 = _gl_ldcg(wb, ok)
        w1 = _gl_ldcg(wb + ((1 % r4) * w8 + 16 * (1 // r4)), ok)
        w2 = _gl_ldcg(wb + ((2 % r4) * w8 + 16 * (2 // r4)), ok)
        w3 = _gl_ldcg(wb + ((3 % r4) * w8 + 16 * (3 // r4)), ok)
        s0 = _gl_ldcg(sb, ok).to(gl.int16)
        s1 = _gl_ldcg(sb + ((1 % r4) * s8 + 4 * (1 // r4)), ok).to(gl.int16)
        s2 = _gl_ldcg(sb + ((2 % r4) * s8 + 4 * (2 // r4)), ok).to(gl.int16)
        s3 = _gl_ldcg(sb + ((3 % r4) * s8 + 4 * (3 // r4)), ok).to(gl.int16)
        return w0, w1, w2, w3, s0, s1, s2, s3

    @gluon.jit
    def _gl_wload(wp, sp, w8, s8, wblk, sblk, wst, sst, uu, steps, CH: gl.constexpr):
        """Unit uu's words and scale entries (row block uu // steps, step uu % steps) into registers."""
        blk = uu // steps
        st = uu - blk * steps
        return _gl_wload_at(wp + (blk * wblk + st * wst), sp + (blk * sblk + st * sst), w8, s8, None, CH)

    @gluon.jit
    def _gl_x(xp, st, kp, EVEN_K: gl.constexpr, xk):
        """This step's activation pairs q = 0..3 (ragged K: indices clamped inside the row, where the weight codes
        are zero)."""
        if EVEN_K:
            x0 = gl.load(xp + 64 * st)
            x1 = gl.load(xp + 64 * st + 4)
            x2 = gl.load(xp + 64 * st + 8)
            x3 = gl.load(xp + 64 * st + 12)
        else:
            x0 = gl.load(xp + gl.minimum(xk + 64 * st, kp - 1))
            x1 = gl.load(xp + gl.minimum(xk + 64 * st + 4, kp - 1))
            x2 = gl.load(xp + gl.minimum(xk + 64 * st + 8, kp - 1))
            x3 = gl.load(xp + gl.minimum(xk + 64 * st + 12, kp - 1))
        return x0, x1, x2, x3

    @gluon.jit
    def _gl_x_or_zero(xp, st, kp, EVEN_K: gl.constexpr, xk, LOAD_ONLY: gl.constexpr):
        """`_gl_x`, or zeros for the LOAD_ONLY 2 diagnostic (the weight stream alone)."""
        if LOAD_ONLY == 2:
            z = xk * 0
            x0, x1, x2, x3 = z, z, z, z
        else:
            x0, x1, x2, x3 = _gl_x(xp, st, kp, EVEN_K, xk)
        return x0, x1, x2, x3

    @gluon.jit
    def _gl_mma_step(w0, w1, w2, w3, s0, s1, s2, s3, x0, x1, x2, x3, xp, st, kp, xk, a0, a1, a2, a3, a4, a5, a6,
                     a7, SCALE_KIND: gl.constexpr, BF16: gl.constexpr, CH: gl.constexpr, EVEN_K: gl.constexpr,
                     LOAD_ONLY: gl.constexpr):
        """One unit (step st's chunks) of either grid: `_mma_asm` on the [32 NW, 4] operands, whose slot L is warp
        L // 32, lane L % 32 (CH 2 loads the second chunk's activation pairs here); LOAD_ONLY: every load, no decode
        and no MMA (the output is not y). Returns the eight accumulators (a4-a7 unchanged at CH 2)."""
        if LOAD_ONLY:
            a0 += (w0 ^ w1 ^ w2 ^ w3 ^ x0 ^ x1 ^ x2 ^ x3 ^ (s0 ^ s1 ^ s2 ^ s3).to(gl.int32)).to(gl.float32)
        elif CH == 1:
            a0, a1, a2, a3, a4, a5, a6, a7 = gl.inline_asm_elementwise(
                _G_ASM[4 * SCALE_KIND + 2 * BF16 + CH - 1], _G_CONSTRAINTS[CH - 1],
                [w0, w1, w2, w3, s0, s1, s2, s3, x0, x1, x2, x3, a0, a1, a2, a3, a4, a5, a6, a7],
                dtype=(gl.float32,) * 8, is_pure=True, pack=1)
        else:
            x4, x5, x6, x7 = _gl_x(xp, CH * st + 1, kp, EVEN_K, xk)
            a0, a1, a2, a3 = gl.inline_asm_elementwise(
                _G_ASM[4 * SCALE_KIND + 2 * BF16 + CH - 1], _G_CONSTRAINTS[CH - 1],
                [w0, w1, w2, w3, s0, s1, s2, s3, x0, x1, x2, x3, x4, x5, x6, x7, a0, a1, a2, a3],
                dtype=(gl.float32,) * 4, is_pure=True, pack=1)
        return a0, a1, a2, a3, a4, a5, a6, a7

    @gluon.jit
    def _gl_col(a, i: gl.constexpr, LW: gl.constexpr):
        """[32 NW, 4] with column i = a summed over its words, the other columns 0."""
        ib = gl.expand_dims(gl.arange(0, 4, layout=gl.SliceLayout(0, LW)), 0)
        return gl.where(ib == i, gl.expand_dims(gl.sum(a, axis=1), 1), 0.0)

    @gluon.jit
    def _gl_out(q, row, c, blk: gl.constexpr, os_ptr, bias_ptr, y_ptr, t_ptr, lb_ptr, res_ptr, M, N, stride_ym,
                stride_t, stride_res, HAS_BIAS: gl.constexpr, HAS_LORA: gl.constexpr, R: gl.constexpr,
                HAS_RES: gl.constexpr, NW: gl.constexpr, LW: gl.constexpr, lora_sum=None):
        """`_mma_out` with the layouts pinned; lora_sum: the LoRA update already summed (`_gl_lora_part`), else
        computed here."""
        i = gl.expand_dims(gl.arange(0, 4, layout=gl.SliceLayout(0, LW)), 0)
        rows = gl.expand_dims(row, 1) + 16 * blk + 8 * (i // 2)
        n = gl.expand_dims(2 * c, 1) + i % 2
        ok = (n < M) & (rows < N)
        out = q * gl.load(os_ptr + rows, mask=rows < N, other=0.0)
        if HAS_BIAS:
            out += gl.load(bias_ptr + rows, mask=rows < N, other=0.0).to(gl.float32)
        if lora_sum is not None:
            out += lora_sum
        elif HAS_LORA:
            # one rank at a time on LW itself (a 3-D [32 NW, 4, R] tile cost the whole kernel 150 registers), four
            # ranks a loop step so that their loads overlap
            bp = lb_ptr + rows * R
            tp = t_ptr + n * stride_t
            lora = gl.zeros([32 * NW, 4], gl.float32, layout=LW)
            for r0 in range(0, R, 4):
                b0 = gl.load(bp + r0, mask=ok, other=0.0).to(gl.float32)
                b1 = gl.load(bp + r0 + 1, mask=ok, other=0.0).to(gl.float32)
                b2 = gl.load(bp + r0 + 2, mask=ok, other=0.0).to(gl.float32)
                b3 = gl.load(bp + r0 + 3, mask=ok, other=0.0).to(gl.float32)
                e0 = gl.load(tp + r0, mask=ok, other=0.0).to(gl.float32)
                e1 = gl.load(tp + r0 + 1, mask=ok, other=0.0).to(gl.float32)
                e2 = gl.load(tp + r0 + 2, mask=ok, other=0.0).to(gl.float32)
                e3 = gl.load(tp + r0 + 3, mask=ok, other=0.0).to(gl.float32)
                lora += b0 * e0 + b1 * e1 + b2 * e2 + b3 * e3
            out += lora
        if HAS_RES:
            out += gl.load(res_ptr + n * stride_res + rows, mask=ok, other=0.0).to(gl.float32)
        gl.store(y_ptr + n * stride_ym + rows, out.to(y_ptr.dtype.element_ty), mask=ok)

    @gluon.jit
    def _gl_run_end(a0, a1, a2, a3, a4, a5, a6, a7, u, u0, pid, per, steps, L, c, rbase,
                    os_row, bias_ptr, y_ptr, ws_ptr, cnt_ptr, t_ptr, lb_ptr, res_ptr, M, N, stride_ym, stride_t,
                    stride_res, HAS_BIAS: gl.constexpr, HAS_LORA: gl.constexpr, R: gl.constexpr,
                    HAS_RES: gl.constexpr, NW: gl.constexpr, MAX_PARTS: gl.constexpr, LW: gl.constexpr,
                    TILES: gl.constexpr):
        """`_run_end` with the layouts pinned."""
        blk = u // steps
        row = blk * (16 * TILES * NW) + rbase
        q0 = _gl_col(a0, 0, LW) + _gl_col(a1, 1, LW) + _gl_col(a2, 2, LW) + _gl_col(a3, 3, LW)
        q1 = _gl_col(a4, 0, LW) + _gl_col(a5, 1, LW) + _gl_col(a6, 2, LW) + _gl_col(a7, 3, LW)
        first = blk * steps
        if (first >= u0) & (u == first + steps - 1):
            _gl_out(q0, row, c, 0, os_row, bias_ptr, y_ptr, t_ptr, lb_ptr, res_ptr, M, N, stride_ym, stride_t,
                    stride_res, HAS_BIAS, HAS_LORA, R, HAS_RES, NW, LW)
            if TILES == 2:
                _gl_out(q1, row, c, 1, os_row, bias_ptr, y_ptr, t_ptr, lb_ptr, res_ptr, M, N, stride_ym, stride_t,
                        stride_res, HAS_BIAS, HAS_LORA, R, HAS_RES, NW, LW)
        else:
            q_off = gl.expand_dims(L * 4, 1) + gl.expand_dims(gl.arange(0, 4, layout=gl.SliceLayout(0, LW)), 0)
            part = 2 * 32 * NW * 4
            slot = 2 * pid + (blk != u0 // steps).to(gl.int32)
            gl.store(ws_ptr + slot * part + q_off, q0)
            gl.store(ws_ptr + slot * part + 32 * NW * 4 + q_off, q1)
            _cta_barrier()  # every thread's stores precede the one arrival (release is cumulative)
            p0 = first // per
            p1 = (first + steps - 1) // per
            arrived = gl.atomic_add(cnt_ptr + blk, 1, sem="acq_rel", scope="gpu")
            if arrived == p1 - p0:
                t0 = gl.zeros([32 * NW, 4], gl.float32, layout=LW)
                t1 = gl.zeros([32 * NW, 4], gl.float32, layout=LW)
                for i in gl.static_range(MAX_PARTS):
                    pp = p0 + i
                    sl = 2 * pp + (blk != (pp * per) // steps).to(gl.int32)
                    live = q_off * 0 + pp <= p1
                    t0 += gl.load(ws_ptr + sl * part + q_off, mask=live, other=0.0, cache_modifier=".cg")
                    t1 += gl.load(ws_ptr + sl * part + 32 * NW * 4 + q_off, mask=live, other=0.0,
                                  cache_modifier=".cg")
                _gl_out(t0, row, c, 0, os_row, bias_ptr, y_ptr, t_ptr, lb_ptr, res_ptr, M, N, stride_ym, stride_t,
                        stride_res, HAS_BIAS, HAS_LORA, R, HAS_RES, NW, LW)
                if TILES == 2:
                    _gl_out(t1, row, c, 1, os_row, bias_ptr, y_ptr, t_ptr, lb_ptr, res_ptr, M, N, stride_ym,
                            stride_t, stride_res, HAS_BIAS, HAS_LORA, R, HAS_RES, NW, LW)
                gl.atomic_xchg(cnt_ptr + blk, 0)

    @gluon.jit(do_not_specialize=["M"])
    def _fp4_mma_gl(
            x32_ptr, w_ptr, s_ptr, os_ptr, bias_ptr, y_ptr, ws_ptr, cnt_ptr, t_ptr, lb_ptr, res_ptr,
            M, N, K, KWW, TOTAL, PER,
            stride_x32, stride_ym, stride_os, stride_t, stride_res,
            WROW, SROW, WUNIT, SUNIT, WBLK, SBLK,
            SCALE_KIND: gl.constexpr, BF16: gl.constexpr, HAS_BIAS: gl.constexpr, HAS_LORA: gl.constexpr,
            R: gl.constexpr, HAS_RES: gl.constexpr, EVEN_K: gl.constexpr, NW: gl.constexpr,
            MAX_PARTS: gl.constexpr, STAGES: gl.constexpr, CH: gl.constexpr, PF: gl.constexpr = 0,
            LOAD_ONLY: gl.constexpr = 0, DIRECT: gl.constexpr = 0):
        """The GPU kernel (`_fp4_mma` is its interpreter twin): the same programs, with the words and scale entries
        streamed through a STAGES-deep cp.async ring in shared memory (each thread its own bytes, across row-block
        boundaries) and every tensor on the layout LW: [32 NW, 4], slot L = warp L // 32, lane L % 32, the 4 words
        of a row in one thread. DIRECT: no ring; each unit's words and scale entries are loaded straight into
        registers STAGES - 1 units ahead (STAGES 1: in the unit's own step), as a streaming read loads."""
        LW: gl.constexpr = gl.BlockedLayout([1, 4], [32, 1], [NW, 1], [1, 0])
        LV: gl.constexpr = gl.SliceLayout(1, LW)
        SM: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [1, 0])
        TILES: gl.constexpr = 2 // CH
        pid = gl.program_id(0)
        steps = KWW // (16 * CH)
        u0 = pid * PER
        u1 = gl.minimum(u0 + PER, TOTAL)
        L = gl.arange(0, 32 * NW, layout=LV)
        g = (L % 32) // 4
        c = L % 4
        rbase = (L // 32) * (16 * TILES) + g
        rb = gl.expand_dims(gl.arange(0, 4, layout=gl.SliceLayout(0, LW)), 0)
        # every offset is a multiple of 4 elements (`storage_strides`): say so, or the compiler, which cannot see it
        # in a stride that is not a multiple of 16 (a scale row of K 256: 8 entries), falls back to 2-byte copies,
        # which cp.async does not have
        roww = (WROW // 4) * 4
        rows_ = (SROW // 4) * 4
        wst = (WUNIT // 4) * 4
        sst = (SUNIT // 4) * 4
        wblk = (WBLK // 4) * 4
        sblk = (SBLK // 4) * 4
        wp = w_ptr + gl.expand_dims(rbase * roww + 4 * c, 1) + rb
        sp = s_ptr + gl.expand_dims(rbase * rows_, 1) + rb
        # lanes of activation rows >= M read row M - 1: their MMA columns are never stored
        xp = x32_ptr + gl.expand_dims(gl.minimum(g, M - 1) * stride_x32, 1)
        xk = gl.expand_dims(c, 1) + 16 * rb
        if EVEN_K:
            xp = xp + xk
        kp = K // 2
        w8 = 8 * roww
        s8 = 8 * rows_
        os_row = os_ptr + BF16 * stride_os
        if DIRECT:
            # the units ahead, in registers: p* the next one, q* the one after (STAGES 3)
            if STAGES >= 2:
                pw0, pw1, pw2, pw3, ps0, ps1, ps2, ps3 = _gl_wload(wp, sp, w8, s8, wblk, sblk, wst, sst,
                                                                   gl.minimum(u0, u1 - 1), steps, CH)
            if STAGES >= 3:
                qw0, qw1, qw2, qw3, qs0, qs1, qs2, qs3 = _gl_wload(wp, sp, w8, s8, wblk, sblk, wst, sst,
                                                                   gl.minimum(u0 + 1, u1 - 1), steps, CH)
        else:
            w_ring = gl.allocate_shared_memory(gl.int32, [STAGES * 4, 32 * NW, 4], SM)
            s_ring = gl.allocate_shared_memory(s_ptr.dtype.element_ty, [STAGES * 4, 32 * NW, 4], SM)
            for i in gl.static_range(STAGES - 1):
                _gl_issue(w_ring, s_ring, wp, sp, w8, s8, wblk, sblk, wst, sst, gl.minimum(u0 + i, u1 - 1), steps,
                          i, CH)
        a0 = gl.zeros([32 * NW, 4], gl.float32, layout=LW)
        a1 = gl.zeros([32 * NW, 4], gl.float32, layout=LW)
        a2 = gl.zeros([32 * NW, 4], gl.float32, layout=LW)
        a3 = gl.zeros([32 * NW, 4], gl.float32, layout=LW)
        a4 = gl.zeros([32 * NW, 4], gl.float32, layout=LW)
        a5 = gl.zeros([32 * NW, 4], gl.float32, layout=LW)
        a6 = gl.zeros([32 * NW, 4], gl.float32, layout=LW)
        a7 = gl.zeros([32 * NW, 4], gl.float32, layout=LW)
        for u in range(u0, u1):
            j = u - u0
            if DIRECT:
                if STAGES == 1:
                    w0, w1, w2, w3, s0, s1, s2, s3 = _gl_wload(wp, sp, w8, s8, wblk, sblk, wst, sst, u, steps, CH)
                else:
                    w0, w1, w2, w3, s0, s1, s2, s3 = pw0, pw1, pw2, pw3, ps0, ps1, ps2, ps3
                    nw0, nw1, nw2, nw3, ns0, ns1, ns2, ns3 = _gl_wload(
                        wp, sp, w8, s8, wblk, sblk, wst, sst, gl.minimum(u + STAGES - 1, u1 - 1), steps, CH)
                    if STAGES == 2:
                        pw0, pw1, pw2, pw3, ps0, ps1, ps2, ps3 = nw0, nw1, nw2, nw3, ns0, ns1, ns2, ns3
                    else:
                        pw0, pw1, pw2, pw3, ps0, ps1, ps2, ps3 = qw0, qw1, qw2, qw3, qs0, qs1, qs2, qs3
                        qw0, qw1, qw2, qw3, qs0, qs1, qs2, qs3 = nw0, nw1, nw2, nw3, ns0, ns1, ns2, ns3
            else:
                # refill the slot the previous unit read (this thread's own bytes), then wait for this unit's
                _gl_issue(w_ring, s_ring, wp, sp, w8, s8, wblk, sblk, wst, sst, gl.minimum(u + STAGES - 1, u1 - 1),
                          steps, (j + STAGES - 1) % STAGES, CH)
            st = u % steps
            if PF > 0:
                # an L2 prefetch of rows g and g + 8, PF units past the ring's newest: their 128-byte lines reach
                # the L2 before the ring's copies ask for them
                pu = gl.minimum(u + STAGES - 1 + PF, u1 - 1)
                pb = pu // steps
                pst = pu - pb * steps
                pa = w_ptr + (pb * wblk + pst * wst + rbase * roww + 4 * c)
                gl.inline_asm_elementwise("prefetch.global.L2 [$1];\nmov.b32 $0, 0;", "=r,l", [pa], dtype=gl.int32,
                                          is_pure=False, pack=1)
                gl.inline_asm_elementwise("prefetch.global.L2 [$1];\nmov.b32 $0, 0;", "=r,l", [pa + w8],
                                          dtype=gl.int32, is_pure=False, pack=1)
            x0, x1, x2, x3 = _gl_x_or_zero(xp, CH * st, kp, EVEN_K, xk, LOAD_ONLY)
            if not DIRECT:
                async_copy.wait_group(STAGES - 1)
                slot = (j % STAGES) * 4
                w0 = w_ring.index(slot).load(LW)
                w1 = w_ring.index(slot + 1).load(LW)
                w2 = w_ring.index(slot + 2).load(LW)
                w3 = w_ring.index(slot + 3).load(LW)
                s0 = s_ring.index(slot).load(LW).to(gl.int16)
                s1 = s_ring.index(slot + 1).load(LW).to(gl.int16)
                s2 = s_ring.index(slot + 2).load(LW).to(gl.int16)
                s3 = s_ring.index(slot + 3).load(LW).to(gl.int16)
            a0, a1, a2, a3, a4, a5, a6, a7 = _gl_mma_step(w0, w1, w2, w3, s0, s1, s2, s3, x0, x1, x2, x3, xp, st,
                                                          kp, xk, a0, a1, a2, a3, a4, a5, a6, a7, SCALE_KIND, BF16,
                                                          CH, EVEN_K, LOAD_ONLY)
            if (st == steps - 1) | (u == u1 - 1):
                _gl_run_end(a0, a1, a2, a3, a4, a5, a6, a7, u, u0, pid, PER, steps, L, c, rbase, os_row, bias_ptr,
                            y_ptr, ws_ptr, cnt_ptr, t_ptr, lb_ptr, res_ptr, M, N, stride_ym, stride_t, stride_res,
                            HAS_BIAS, HAS_LORA, R, HAS_RES, NW, MAX_PARTS, LW, TILES)
                a0 = gl.zeros([32 * NW, 4], gl.float32, layout=LW)
                a1 = gl.zeros([32 * NW, 4], gl.float32, layout=LW)
                a2 = gl.zeros([32 * NW, 4], gl.float32, layout=LW)
                a3 = gl.zeros([32 * NW, 4], gl.float32, layout=LW)
                a4 = gl.zeros([32 * NW, 4], gl.float32, layout=LW)
                a5 = gl.zeros([32 * NW, 4], gl.float32, layout=LW)
                a6 = gl.zeros([32 * NW, 4], gl.float32, layout=LW)
                a7 = gl.zeros([32 * NW, 4], gl.float32, layout=LW)
        if not DIRECT:
            async_copy.wait_group(0)

    @gluon.jit
    def _gl_warp_reduce(q, red, KW: gl.constexpr, LR: gl.constexpr):
        """[32 KW, 4] q summed over the KW warps, in warp order, through shared memory `red` ([32 KW, 4] fp32):
        [32, 4] on LR (every warp holds the sum)."""
        red.store(q)
        _cta_barrier()
        tot = red.slice(0, 32).load(LR)
        for w in gl.static_range(1, KW):
            tot += red.slice(32 * w, 32).load(LR)
        _cta_barrier()  # `red` is reused for the next tile
        return tot

    @gluon.jit
    def _gl_warp_sum(a0, a1, a2, a3, red, KW: gl.constexpr, LW: gl.constexpr, LR: gl.constexpr):
        """The [32 KW, 4] accumulators of one tile summed over their words (`_gl_col`) and over the warps
        (`_gl_warp_reduce`)."""
        q = _gl_col(a0, 0, LW) + _gl_col(a1, 1, LW) + _gl_col(a2, 2, LW) + _gl_col(a3, 3, LW)
        return _gl_warp_reduce(q, red, KW, LR)

    @gluon.jit
    def _gl_lora_part(lb_ptr, t_ptr, row0, g, c, warp, M, N, stride_t, R: gl.constexpr, RW: gl.constexpr,
                      LW: gl.constexpr):
        """[32 KW, 4]: warp w's part of one 16-row tile's LoRA update t @ B^T (slot (lane (g, c), i): row row0 + g
        + 8 (i // 2), activation row 2c + i % 2, as `_gl_out`'s), ranks RW w .. RW (w + 1) - 1 in rank order; the
        warps' parts are summed by `_gl_warp_reduce`. Each warp loads 2 RW values an output once, all in flight
        together, where `_gl_out`'s own loop (every warp all R ranks) waits R / 4 times."""
        i = gl.expand_dims(gl.arange(0, 4, layout=gl.SliceLayout(0, LW)), 0)
        rows = gl.expand_dims(row0 + g, 1) + 8 * (i // 2)
        n = gl.expand_dims(2 * c, 1) + i % 2
        ok = (n < M) & (rows < N)
        bp = lb_ptr + rows * R + warp * RW
        tp = t_ptr + n * stride_t + warp * RW
        acc = gl.load(bp, mask=ok, other=0.0).to(gl.float32) * gl.load(tp, mask=ok, other=0.0).to(gl.float32)
        for r in gl.static_range(1, RW):
            acc += gl.load(bp + r, mask=ok, other=0.0).to(gl.float32) * gl.load(tp + r, mask=ok, other=0.0).to(
                gl.float32)
        return acc

    @gluon.jit
    def _gl_lora_parts(lb_ptr, t_ptr, row0, g, c, warp, M, N, stride_t, R: gl.constexpr, KW: gl.constexpr,
                       TILES: gl.constexpr, LW: gl.constexpr):
        """`_gl_lora_part` of a row block's TILES tiles (rows row0 and row0 + 16), R / KW ranks a warp."""
        lw0 = _gl_lora_part(lb_ptr, t_ptr, row0, g, c, warp, M, N, stride_t, R, R // KW, LW)
        lw1 = lw0
        if TILES == 2:
            lw1 = _gl_lora_part(lb_ptr, t_ptr, row0 + 16, g, c, warp, M, N, stride_t, R, R // KW, LW)
        return lw0, lw1

    @gluon.jit(do_not_specialize=["M"])
    def _fp4_mma_rows_gl(
            x32_ptr, w_ptr, s_ptr, os_ptr, bias_ptr, y_ptr, ws_ptr, cnt_ptr, t_ptr, lb_ptr, res_ptr,
            M, N, K, KWW, NB,
            stride_x32, stride_ym, stride_os, stride_t, stride_res,
            WROW, SROW, WUNIT, SUNIT, WBLK, SBLK,
            SCALE_KIND: gl.constexpr, BF16: gl.constexpr, HAS_BIAS: gl.constexpr, HAS_LORA: gl.constexpr,
            R: gl.constexpr, HAS_RES: gl.constexpr, EVEN_K: gl.constexpr, KW: gl.constexpr, SPLIT: gl.constexpr,
            STAGES: gl.constexpr, CH: gl.constexpr, LOAD_ONLY: gl.constexpr = 0, PRE: gl.constexpr = 0):
        """The row-block grid (GRID "rows"): program (b, s) takes row block b (16 rows a tile, 2 // CH tiles) over
        its s-th of SPLIT equal runs of units; its KW warps split the run, warp w taking units w, w + KW, ... with
        the words and scale entries loaded straight into registers (STAGES 2: one unit ahead), the same MMA step as
        `_fp4_mma_gl`; the warps' sums meet in shared memory (warp order) and, with SPLIT > 1, the row block's parts
        in the workspace (the last program to arrive sums them in split order and runs the epilogue; deterministic).
        No program waits on another's atomic mid-stream: the only cross-program step is the split's one arrival.
        Persistent: program (p, s) takes row blocks p, p + P, ... of the NB (P programs along the grid's first
        dimension), so its set-up is paid once and the grid is one wave. PRE (LoRA, SPLIT 1): the LoRA update split
        over the warps by rank (`_gl_lora_part`) and summed with the products' warp sums, its loads issued before the
        row block's main loop (1, `rows_launch_args`' default) or after it (2); 0: `_gl_out` computes it, every warp
        all ranks, R / 4 dependent load rounds (call 68: o with LoRA and residual 12.6 us, 8.4 with PRE 1)."""
        LW: gl.constexpr = gl.BlockedLayout([1, 4], [32, 1], [KW, 1], [1, 0])
        LV: gl.constexpr = gl.SliceLayout(1, LW)
        LR: gl.constexpr = gl.BlockedLayout([1, 4], [32, 1], [KW, 1], [1, 0])  # [32, 4]: replicated over the warps
        SM: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [1, 0])
        TILES: gl.constexpr = 2 // CH
        pid_s = gl.program_id(1)
        steps = KWW // (16 * CH)
        per = (steps + SPLIT - 1) // SPLIT
        s0 = pid_s * per
        s1 = gl.minimum(s0 + per, steps)
        L = gl.arange(0, 32 * KW, layout=LV)
        g = (L % 32) // 4
        c = L % 4
        warp = gl.expand_dims(L // 32, 1)
        rb = gl.expand_dims(gl.arange(0, 4, layout=gl.SliceLayout(0, LW)), 0)
        roww = (WROW // 4) * 4
        rows_ = (SROW // 4) * 4
        wst = (WUNIT // 4) * 4
        sst = (SUNIT // 4) * 4
        wblk = (WBLK // 4) * 4
        sblk = (SBLK // 4) * 4
        w_lane = gl.expand_dims(g * roww + 4 * c, 1) + rb
        s_lane = gl.expand_dims(g * rows_, 1) + rb
        xp = x32_ptr + gl.expand_dims(gl.minimum(g, M - 1) * stride_x32, 1)
        xk = gl.expand_dims(c, 1) + 16 * rb
        if EVEN_K:
            xp = xp + xk
        kp = K // 2
        w8 = 8 * roww
        s8 = 8 * rows_
        os_row = os_ptr + BF16 * stride_os
        iters = (s1 - s0 + KW - 1) // KW
        red = gl.allocate_shared_memory(gl.float32, [32 * KW, 4], SM)
        for pid_b in range(gl.program_id(0), NB, gl.num_programs(0)):
            wp = w_ptr + (pid_b * wblk + w_lane)
            sp = s_ptr + (pid_b * sblk + s_lane)
            st = s0 + warp                                       # [32 KW, 1]: this warp's unit
            pw0, pw1, pw2, pw3, ps0, ps1, ps2, ps3 = _gl_wload_at(wp + st * wst, sp + st * sst, w8, s8, st < s1,
                                                                  CH)
            a0 = gl.zeros([32 * KW, 4], gl.float32, layout=LW)
            a1 = gl.zeros([32 * KW, 4], gl.float32, layout=LW)
            a2 = gl.zeros([32 * KW, 4], gl.float32, layout=LW)
            a3 = gl.zeros([32 * KW, 4], gl.float32, layout=LW)
            a4 = gl.zeros([32 * KW, 4], gl.float32, layout=LW)
            a5 = gl.zeros([32 * KW, 4], gl.float32, layout=LW)
            a6 = gl.zeros([32 * KW, 4], gl.float32, layout=LW)
            a7 = gl.zeros([32 * KW, 4], gl.float32, layout=LW)
            if PRE == 1:
                lw0, lw1 = _gl_lora_parts(lb_ptr, t_ptr, pid_b * (16 * TILES), g, c, warp, M, N, stride_t, R, KW,
                                          TILES, LW)
            for i in range(iters):
                w0, w1, w2, w3, s0_, s1_, s2_, s3_ = pw0, pw1, pw2, pw3, ps0, ps1, ps2, ps3
                if STAGES >= 2:
                    nx = st + KW
                    pw0, pw1, pw2, pw3, ps0, ps1, ps2, ps3 = _gl_wload_at(wp + nx * wst, sp + nx * sst, w8, s8,
                                                                          nx < s1, CH)
                xs = gl.minimum(st, s1 - 1)                      # units past the run: zero words, any real x
                x0, x1, x2, x3 = _gl_x_or_zero(xp, CH * xs, kp, EVEN_K, xk, LOAD_ONLY)
                a0, a1, a2, a3, a4, a5, a6, a7 = _gl_mma_step(w0, w1, w2, w3, s0_, s1_, s2_, s3_, x0, x1, x2, x3, xp,
                                                              xs, kp, xk, a0, a1, a2, a3, a4, a5, a6, a7, SCALE_KIND,
                                                              BF16, CH, EVEN_K, LOAD_ONLY)
                if STAGES < 2:
                    nx = st + KW
                    pw0, pw1, pw2, pw3, ps0, ps1, ps2, ps3 = _gl_wload_at(wp + nx * wst, sp + nx * sst, w8, s8,
                                                                          nx < s1, CH)
                st = st + KW
            q0 = _gl_warp_sum(a0, a1, a2, a3, red, KW, LW, LR)
            q1 = q0
            if TILES == 2:
                q1 = _gl_warp_sum(a4, a5, a6, a7, red, KW, LW, LR)
            LRV: gl.constexpr = gl.SliceLayout(1, LR)
            lr = gl.arange(0, 32, layout=LRV)
            gr = lr // 4
            cr = lr % 4
            row = pid_b * (16 * TILES) + gr
            if PRE:
                if PRE == 2:
                    lw0, lw1 = _gl_lora_parts(lb_ptr, t_ptr, pid_b * (16 * TILES), g, c, warp, M, N, stride_t, R,
                                              KW, TILES, LW)
                l0 = _gl_warp_reduce(lw0, red, KW, LR)
                _gl_out(q0, row, cr, 0, os_row, bias_ptr, y_ptr, t_ptr, lb_ptr, res_ptr, M, N, stride_ym, stride_t,
                        stride_res, HAS_BIAS, HAS_LORA, R, HAS_RES, 1, LR, l0)
                if TILES == 2:
                    l1 = _gl_warp_reduce(lw1, red, KW, LR)
                    _gl_out(q1, row, cr, 1, os_row, bias_ptr, y_ptr, t_ptr, lb_ptr, res_ptr, M, N, stride_ym, stride_t,
                            stride_res, HAS_BIAS, HAS_LORA, R, HAS_RES, 1, LR, l1)
            elif SPLIT == 1:
                _gl_out(q0, row, cr, 0, os_row, bias_ptr, y_ptr, t_ptr, lb_ptr, res_ptr, M, N, stride_ym, stride_t,
                        stride_res, HAS_BIAS, HAS_LORA, R, HAS_RES, 1, LR)
                if TILES == 2:
                    _gl_out(q1, row, cr, 1, os_row, bias_ptr, y_ptr, t_ptr, lb_ptr, res_ptr, M, N, stride_ym, stride_t,
                            stride_res, HAS_BIAS, HAS_LORA, R, HAS_RES, 1, LR)
            else:
                q_off = gl.expand_dims(lr * 4, 1) + gl.expand_dims(gl.arange(0, 4, layout=gl.SliceLayout(0, LR)), 0)
                part = TILES * 32 * 4
                base = (pid_b * SPLIT + pid_s) * part
                gl.store(ws_ptr + base + q_off, q0)
                if TILES == 2:
                    gl.store(ws_ptr + base + 128 + q_off, q1)
                _cta_barrier()  # every thread's stores precede the one arrival (release is cumulative)
                arrived = gl.atomic_add(cnt_ptr + pid_b, 1, sem="acq_rel", scope="gpu")
                if arrived == SPLIT - 1:
                    t0 = gl.zeros([32, 4], gl.float32, layout=LR)
                    t1 = gl.zeros([32, 4], gl.float32, layout=LR)
                    for sp_ in gl.static_range(SPLIT):
                        t0 += gl.load(ws_ptr + (pid_b * SPLIT + sp_) * part + q_off, cache_modifier=".cg")
                        if TILES == 2:
                            t1 += gl.load(ws_ptr + (pid_b * SPLIT + sp_) * part + 128 + q_off, cache_modifier=".cg")
                    _gl_out(t0, row, cr, 0, os_row, bias_ptr, y_ptr, t_ptr, lb_ptr, res_ptr, M, N, stride_ym, stride_t,
                            stride_res, HAS_BIAS, HAS_LORA, R, HAS_RES, 1, LR)
                    if TILES == 2:
                        _gl_out(t1, row, cr, 1, os_row, bias_ptr, y_ptr, t_ptr, lb_ptr, res_ptr, M, N, stride_ym,
                                stride_t, stride_res, HAS_BIAS, HAS_LORA, R, HAS_RES, 1, LR)
                    gl.atomic_xchg(cnt_ptr + pid_b, 0)


def mma_config(n_pad: int, k_words: int, n_sm: int, cps: int = 16, nw: int = 1, stages: int = 3,
               ch: int | None = None) -> dict:
    """Knobs for N_pad weight rows and K_pad / 8 words on n_sm SMs: NW warps a CTA, CH 128-column chunks a unit
    (2 where the chunks pair up: each row's 128 contiguous bytes a unit, one 16-row tile a warp; 1: 64 bytes of
    two tiles), STAGES units in the cp.async ring, and the persistent grid: PER (row block, unit) units a program,
    so that about `cps` programs run on each SM (one wave: call 47's split-K grid of 1.1 waves ran 1.4x slower than
    0.6) and a row block is shared by at most MAX_SPLIT programs. One warp a CTA by default: the shared-memory
    barriers Triton's analysis puts between the ring's refills and reads (it cannot see that each thread reads only
    its own bytes) then synchronise one warp, not four."""
    chunks = k_words // 16
    ch = (2 if chunks % 2 == 0 else 1) if ch is None else ch
    blocks = -(-n_pad // (32 * nw // ch))
    steps = chunks // ch
    total = blocks * steps
    per = max(-(-total // (cps * n_sm)), -(-steps // (MAX_SPLIT - 1)), 1)
    return dict(NW=nw, CH=ch, STAGES=stages, PER=per, GRID=-(-total // per))


def tile_prepared(w: PreparedFP4, nw: int = 1, ch: int = 2) -> PreparedFP4:
    """A copy of w whose codes and scale entries are stored tile by tile: each (row block of 16 (2 // ch) nw rows,
    unit of ch 128-column chunks) of `fp4_gemm_mma`'s work contiguous (2 KB of codes at nw 1, ch 2), so that a unit
    is one contiguous read instead of a short read from each of its rows (the question of issue 22's calls 47-50).
    Only fp4_gemm_mma reads it, with config TILED=True and the same NW and CH; an experiment, not a load-time
    layout (every other kernel reads the row-major one)."""
    n_pad, kww = w.words.shape
    rows = 16 * (2 // ch) * nw
    if ch not in (1, 2) or n_pad % rows or kww % (16 * ch):
        raise ValueError(f"tile_prepared: {n_pad} x {kww} words do not tile into {rows} rows x {16 * ch} words")
    blocks, steps = n_pad // rows, kww // (16 * ch)

    def tile(t, per_unit):
        return t.reshape(blocks, rows, steps, per_unit).permute(0, 2, 1, 3).contiguous().reshape(t.shape)
    return PreparedFP4(tile(w.words, 16 * ch), tile(w.scales, 4 * ch), w.out_scales, w.n, w.k, w.scale_kind,
                       w.parts)


def storage_strides(w: PreparedFP4, nw: int, ch: int, tiled: bool) -> tuple[int, int, int, int, int, int]:
    """Where the kernel finds its codes and scale entries, in elements: (a row's words, a row's scale entries, a
    unit's words, a unit's entries, a row block's words, a row block's entries). Row-major (the load-time layout):
    rows one stride apart, a unit CH chunks along the row; tiled (`tile_prepared`'s copy for this NW and CH): each
    (row block, unit) tile contiguous, its rows 16 CH words (4 CH entries) apart."""
    rows_blk = 16 * (2 // ch) * nw
    steps = w.words.shape[1] // (16 * ch)
    if tiled:
        wunit, sunit = rows_blk * 16 * ch, rows_blk * 4 * ch
        return 16 * ch, 4 * ch, wunit, sunit, steps * wunit, steps * sunit
    wrow, srow = w.words.stride(0), w.scales.stride(0)
    return wrow, srow, 16 * ch, 4 * ch, rows_blk * wrow, rows_blk * srow


def selected(x: torch.Tensor, w=None) -> dict | None:
    """The knobs to run this call with if the default forward should take this kernel, else None: M <= MMA_MAX_M
    and QERL_FP4_MMA=1 (every eligible call, `mma_config`'s knobs); QERL_FP4_MMA=0 never; unset, where
    MEASURED_WINS has the (device, format, dtype, N, K, M) entry of w, or every call with DEFAULT_ON on a CUDA
    device of compute capability 8.0+."""
    mode = os.environ.get("QERL_FP4_MMA", "")
    runs_here = HAVE_GLUON if x.is_cuda else interpret_mode()  # the Gluon kernel on a GPU, its twin interpreted
    if mode == "0" or not 1 <= x.shape[0] <= MMA_MAX_M or not runs_here:
        return None
    if mode == "1":
        return {}
    if not x.is_cuda:
        return None
    if w is not None and MEASURED_WINS:
        from qerl_kernels.fp4_gemv import _device_key
        key = (_device_key(x.device.index or 0), w.scale_kind, "bf16" if x.dtype == torch.bfloat16 else "fp16",
               w.n, w.k, x.shape[0])
        if key in MEASURED_WINS:
            return dict(MEASURED_WINS[key])
    return {} if DEFAULT_ON and torch.cuda.get_device_capability(x.device)[0] >= 8 else None


def fp4_gemm_mma(x: torch.Tensor, w: PreparedFP4, bias: torch.Tensor | None = None, *, lora: tuple | None = None,
                 residual: torch.Tensor | None = None, config: dict | None = None) -> torch.Tensor:
    """y = x @ W^T (+ bias) (+ t @ B^T) (+ residual), M <= 8, fp32 accumulation, output in x's dtype.

    Args:
        x: [M, K] float16/bfloat16 on the weight's device (CUDA, or CPU under TRITON_INTERPRET=1), M <= 8.
        w: PreparedFP4 (single weight or `concat_prepared` group; NVFP4 or MXFP4).
        bias: optional [N]. lora: optional (t [M, R], B [>= N, R] contiguous): t @ B^T added (fp4_launch.fp4_gemm
            checks its shapes). residual: optional [M, N] added last.
        config: knobs overriding `mma_config`: NW (warps a CTA: 1, 2 or 4), CH (128-column chunks a unit: 1 or
            2), STAGES (the cp.async ring's depth, 2-8), PER (units a program) or CPS (programs per SM to aim at;
            PER follows), PF (units past the ring to prefetch into L2; 0: none), TILED (w is `tile_prepared`'s,
            with this NW and CH), DIRECT (no ring: the words and scale entries loaded straight into registers,
            STAGES - 1 units ahead, STAGES 1-3), LOAD_ONLY (a diagnostic; the output is not the product: 1 the
            same loads without the decode and the MMAs, so the memory pipeline's own time shows; 2 the weight
            stream alone, no activation loads either; the interpreter twin treats 2 as 1). GRID "rows": the
            row-block grid instead (`rows_launch_args` reads its knobs: CH, KW, SPLIT, STAGES 1-2, TILED with
            `tile_prepared(w, 1, CH)`, LOAD_ONLY).

    Raises:
        ValueError: shape, dtype or device mismatch, M > 8, or bad knobs.
    """
    x, y = _skinny_io(x, w, bias, MMA_MAX_M, "fp4_gemm_mma")
    m = x.shape[0]
    if residual is not None and tuple(residual.shape) != (m, w.n):
        raise ValueError(f"fp4_gemm_mma: residual {tuple(residual.shape)} is not [{m}, {w.n}]")
    if m == 0:
        return y
    interp = interpret_mode()
    if not interp and not HAVE_GLUON:
        raise RuntimeError("fp4_gemm_mma: this Triton has no Gluon (triton.experimental.gluon, Triton >= 3.5)")
    n_sm = 2 if interp else _num_sms(x.device.index or 0)
    if (config or {}).get("GRID", "stream") == "rows" and not interp:
        grid, args, meta = rows_launch_args(x, w, bias, lora, residual, y, n_sm, config)
        _fp4_mma_rows_gl[grid](*args, **meta)
        return y
    if interp and (config or {}).get("GRID") == "rows":  # the twin has the stream-K programs only: the same
        # product over its own grid, on the same storage (tile_prepared(w, 1, CH) is the stream-K kernel's at NW 1)
        config = dict({k: config[k] for k in ("CH", "TILED", "LOAD_ONLY") if k in config}, NW=1)
    grid, args, meta = launch_args(x, w, bias, lora, residual, y, n_sm, config)
    (_fp4_mma if interp else _fp4_mma_gl)[grid](*args, **meta)
    return y


def launch_args(x: torch.Tensor, w: PreparedFP4, bias, lora, residual, y: torch.Tensor, n_sm: int,
                config: dict | None = None) -> tuple[tuple, tuple, dict]:
    """(grid, positional arguments, meta-parameters) of one launch of `_fp4_mma_gl` (GPU) or its interpreter twin
    `_fp4_mma` (same signature): the one place that turns the knobs into a launch (fp4_gemm_mma runs it; the offline
    build compiles it from CPU tensors of the same shapes).

    Raises:
        ValueError: knobs the kernel does not support (the message names them).
    """
    m = x.shape[0]
    n_pad, kww = w.words.shape
    config = dict(config or {})
    cps = int(config.pop("CPS", 16))
    cfg = mma_config(n_pad, kww, n_sm, cps, int(config.get("NW", 1)), int(config.get("STAGES", 3)),
                     config.get("CH"))
    nw, ch, stages = cfg["NW"], cfg["CH"], cfg["STAGES"]
    steps = kww // (16 * ch) if ch in (1, 2) else 0
    blocks = n_pad // (32 * nw // ch) if ch in (1, 2) else 0
    if "PER" in config:
        cfg.update(PER=int(config["PER"]), GRID=-(-blocks * steps // int(config["PER"])))
    per, grid = cfg["PER"], cfg["GRID"]
    direct = bool(config.get("DIRECT", False))
    if nw not in (1, 2, 4) or ch not in (1, 2) or n_pad % (32 * nw // ch) or kww % (16 * ch) or \
            not (1 <= stages <= 3 if direct else 2 <= stages <= 8) or \
            not max(1, -(-steps // (MAX_SPLIT - 1))) <= per:
        raise ValueError(f"fp4_gemm_mma: bad knobs {cfg} for {n_pad} padded rows and {kww} words a row (NW 1, 2 "
                         f"or 4; CH 1 or 2, dividing the 128-column chunks; STAGES 2-8, with DIRECT 1-3; PER >= the "
                         f"units a row block / {MAX_SPLIT - 1}, so that at most {MAX_SPLIT} programs share a row "
                         "block)")
    ws, cnt = _workspace(x.device, grid * 2 * 2 * 32 * nw * 4, blocks)
    dummy = w.out_scales
    t_arg, lb_arg = (lora[0], lora[1]) if lora is not None else (dummy, dummy)
    res_arg = residual if residual is not None else dummy
    x32 = x.view(torch.int32)  # K is a multiple of 16 for both formats: whole pairs per row
    args = (x32, w.words, w.scales, w.out_scales, bias.contiguous() if bias is not None else dummy, y, ws, cnt,
            t_arg, lb_arg, res_arg,
            m, w.n, w.k, kww, blocks * steps, per,
            x32.stride(0), y.stride(0), w.out_scales.stride(0), t_arg.stride(0), res_arg.stride(0),
            *storage_strides(w, nw, ch, bool(config.get("TILED", False))))
    meta = dict(SCALE_KIND=w.scale_kind, BF16=x.dtype == torch.bfloat16, HAS_BIAS=bias is not None,
                HAS_LORA=lora is not None, R=lora[1].shape[1] if lora is not None else 16,
                HAS_RES=residual is not None, EVEN_K=w.k == kww * 8, NW=nw, MAX_PARTS=MAX_SPLIT, STAGES=stages,
                CH=ch, PF=int(config.get("PF", 0)), LOAD_ONLY=int(config.get("LOAD_ONLY", 0)), DIRECT=int(direct),
                num_warps=nw)
    return (grid,), args, meta


def rows_config(n_pad: int, k_words: int, n_sm: int, ch: int | None = None, kw: int | None = None) -> dict:
    """Knobs of the row-block grid (GRID "rows") for N_pad rows and K_pad / 8 words on n_sm SMs: CH as mma_config;
    KW (given, or: a power of two, at most 8 and at most half the units) warps a CTA splitting a row block's units;
    SPLIT runs a row block where the row blocks times KW would give fewer than 8 warps an SM; CPB programs an SM of
    the persistent grid, 24 warps an SM (they fit with the registers capped at 80, MAXNREG; the kernel takes 102
    uncapped, call 64; 0: one program a row block)."""
    chunks = k_words // 16
    ch = (2 if chunks % 2 == 0 else 1) if ch is None else ch
    steps = chunks // ch
    blocks = -(-n_pad // (32 // ch))
    if kw is None:
        kw = 1 << (max(1, min(8, steps // 2)).bit_length() - 1)   # a power of two (a layout's warps)
    split = max(1, min(steps // max(kw, 1), MAX_SPLIT, -(-8 * n_sm // (blocks * max(kw, 1)))))
    return dict(GRID="rows", CH=ch, KW=kw, SPLIT=split, STAGES=2, CPB=max(1, 24 // max(kw, 1)))


def rows_launch_args(x: torch.Tensor, w: PreparedFP4, bias, lora, residual, y: torch.Tensor, n_sm: int,
                     config: dict | None = None) -> tuple[tuple, tuple, dict]:
    """(grid, positional arguments, meta-parameters) of one `_fp4_mma_rows_gl` launch (the row-block grid): the
    one place that turns its knobs (`rows_config`, overridden by config's CH, KW, SPLIT, STAGES 1-2, TILED: w is
    `tile_prepared(w, 1, CH)`'s, CPB, MAXNREG: registers a thread at most, LOAD_ONLY, PRE: where the LoRA update
    is computed, default 1, ignored without LoRA or with SPLIT > 1) into a launch.

    Raises:
        ValueError: knobs the kernel does not support (the message names them).
    """
    m = x.shape[0]
    n_pad, kww = w.words.shape
    config = dict(config or {})
    cfg = rows_config(n_pad, kww, n_sm, config.get("CH"), int(config["KW"]) if "KW" in config else None)
    cfg.update({k: int(config[k]) for k in ("SPLIT", "STAGES", "CPB") if k in config})
    ch, kw, split, stages, cpb = cfg["CH"], cfg["KW"], cfg["SPLIT"], cfg["STAGES"], cfg["CPB"]
    pre = int(config.get("PRE", 1))
    steps = kww // (16 * ch) if ch in (1, 2) else 0
    if ch not in (1, 2) or n_pad % (32 // ch) or kww % (16 * ch) or kw not in (1, 2, 4, 8) or \
            not 1 <= split <= min(MAX_SPLIT, steps) or stages not in (1, 2) or cpb < 0 or pre not in (0, 1, 2):
        raise ValueError(f"fp4_gemm_mma: bad row-grid knobs {dict(cfg, PRE=pre)} for {n_pad} padded rows and {kww} "
                         f"words a row (CH 1 or 2, dividing the 128-column chunks; KW 1, 2, 4 or 8; SPLIT "
                         f"1..min({MAX_SPLIT}, units a row); STAGES 1 or 2; CPB >= 0; PRE 0, 1 or 2)")
    blocks = n_pad // (32 // ch)
    ws, cnt = _workspace(x.device, blocks * split * 2 * 32 * 4 if split > 1 else 1, blocks)
    dummy = w.out_scales
    t_arg, lb_arg = (lora[0], lora[1]) if lora is not None else (dummy, dummy)
    res_arg = residual if residual is not None else dummy
    x32 = x.view(torch.int32)
    args = (x32, w.words, w.scales, w.out_scales, bias.contiguous() if bias is not None else dummy, y, ws, cnt,
            t_arg, lb_arg, res_arg, m, w.n, w.k, kww, blocks,
            x32.stride(0), y.stride(0), w.out_scales.stride(0), t_arg.stride(0), res_arg.stride(0),
            *storage_strides(w, 1, ch, bool(config.get("TILED", False))))
    meta = dict(SCALE_KIND=w.scale_kind, BF16=x.dtype == torch.bfloat16, HAS_BIAS=bias is not None,
                HAS_LORA=lora is not None, R=lora[1].shape[1] if lora is not None else 16,
                HAS_RES=residual is not None, EVEN_K=w.k == kww * 8, KW=kw, SPLIT=split, STAGES=stages, CH=ch,
                LOAD_ONLY=int(config.get("LOAD_ONLY", 0)), PRE=pre if lora is not None and split == 1 else 0,
                num_warps=kw)
    if config.get("MAXNREG"):  # a register cap, so that CPB programs fit an SM (the compiler's launch option)
        meta["maxnreg"] = int(config["MAXNREG"])
    return (min(blocks, n_sm * cpb) if cpb else blocks, split), args, meta


def check_layout(ttgir: str, nw: int) -> bool:
    """Whether the compiled kernel's inline-asm MMA step runs on the [32 NW, 4] blocked layout whose dimension-0
    slot L is warp L // 32, lane L % 32 (what the MMA's lane roles assume)."""
    asm_ops = [line for line in ttgir.splitlines() if "elementwise_inline_asm" in line and "mma.sync" in line]
    if not asm_ops:
        return False
    layouts = dict(re.findall(r"(#\w+) = #ttg\.blocked<\{(.*?)\}>", ttgir))
    for line in asm_ops:
        enc = re.findall(r"tensor<\d+x4x\w+, (#\w+)>", line)
        if not enc or any(e not in layouts for e in enc):
            return False
        for e in set(enc):
            found = _LAYOUT.search(layouts[e])
            if found is None or int(found.group(1)) != nw:
                return False
    return True


# ---------------------------------------------------------------------------------------------------------------
# Offline build: `python -m qerl_kernels.fp4_mma [--only NAME ...] [--json]` builds the launches below for
# sm_90 on any machine (ptxas is bundled): registers, spills, the asm operands' layout and the main loop's SASS
# instructions per 4-byte word of codes.
# ---------------------------------------------------------------------------------------------------------------
def compile_variants() -> dict[str, tuple]:
    """{name: (N, K, M, scale_kind, bf16, bias, lora, residual, config)}: the 7B decode launches (gate/up group,
    down with LoRA and residual, q/k/v group) and the other formats / epilogues."""
    return {
        "gateup-m1": (37888, 3584, 1, 0, True, False, False, False, None),
        "down-lora-res-m1": (3584, 18944, 1, 0, True, False, True, True, None),
        "qkv-m8": (4608, 3584, 8, 0, True, False, False, False, None),
        "o-nw2-m1": (3584, 3584, 1, 0, True, False, True, True, {"NW": 2}),
        "mx-fp16-bias-m3": (18944, 3584, 3, 1, False, True, False, False, None),
        "ragged-m2": (200, 400, 2, 0, True, True, False, False, {"PER": 2}),
        "gateup-tiled-m1": (37888, 3584, 1, 0, True, False, False, False, {"TILED": True}),
        "gateup-direct-m1": (37888, 3584, 1, 0, True, False, False, False, {"TILED": True, "DIRECT": True,
                                                                            "STAGES": 2}),
        "down-lora-res-direct3-m1": (3584, 18944, 1, 0, True, False, True, True, {"DIRECT": True, "STAGES": 3}),
        "mx-direct1-m8": (18944, 3584, 8, 1, True, False, False, False, {"DIRECT": True, "STAGES": 1}),
        "o-lora-res-direct-m1": (3584, 3584, 1, 0, True, False, True, True, {"DIRECT": True, "STAGES": 2}),
        "gateup-rows-m1": (37888, 3584, 1, 0, True, False, False, False, {"GRID": "rows", "TILED": True}),
        "gateup-rows-table-m1": (37888, 3584, 1, 0, True, False, False, False,
                                 MEASURED_WINS[("h100", 0, "bf16", 37888, 3584, 1)]),
        "o-lora-res-rows-table-m1": (3584, 3584, 1, 0, True, False, True, True,
                                     MEASURED_WINS[("h100", 0, "bf16", 3584, 3584, 1)]),
        "down-lora-res-rows-table-m1": (3584, 18944, 1, 0, True, False, True, True,
                                        MEASURED_WINS[("h100", 0, "bf16", 3584, 18944, 1)]),
        "down-lora-res-rows-m1": (3584, 18944, 1, 0, True, False, True, True, {"GRID": "rows"}),
        "mx-rows-ch1-pre1-m2": (200, 400, 2, 1, False, True, True, True,   # two tiles a row block, LoRA PRE 1
                                {"GRID": "rows", "KW": 2, "CH": 1, "SPLIT": 1, "PRE": 1}),
        "o-rows-split2-m8": (3584, 3584, 8, 0, True, True, True, True, {"GRID": "rows", "KW": 4, "SPLIT": 2}),
        "mx-rows-ch1-m2": (200, 400, 2, 1, False, True, False, False, {"GRID": "rows", "SPLIT": 2}),
        "tiny-k256-lora-m3": (81, 256, 3, 0, True, False, True, True, {"NW": 1, "PER": 3}),
        "tiny-mx-nw1-m1": (81, 416, 1, 1, True, False, False, False, {"NW": 1, "PER": 3}),
    }


def _build(name: str, arch: int = 90):
    from qerl_kernels.gluon_compile import compile_launch, empty_prepared
    n, k, m, kind, bf16, bias, lora, res, cfg = compile_variants()[name]
    dt = torch.bfloat16 if bf16 else torch.float16
    w = empty_prepared(n, k, kind)
    x, y = torch.empty(m, k, dtype=dt), torch.empty(m, n, dtype=dt)
    lo = (torch.empty(m, 32, dtype=dt), torch.empty(w.words.shape[0], 32, dtype=dt)) if lora else None
    rows = (cfg or {}).get("GRID") == "rows"
    grid, args, meta = (rows_launch_args if rows else launch_args)(
        x, w, torch.empty(n, dtype=dt) if bias else None, lo, torch.empty(m, n, dtype=dt) if res else None, y, 132,
        cfg)
    kernel = _fp4_mma_rows_gl if rows else _fp4_mma_gl
    return compile_launch(kernel, args, dict(meta, debug=False), arch, gluon=True), grid, meta


def loop_sass(cubin: bytes) -> dict:
    """The SASS of the kernel's main loop as a unit takes it when the run does not end there: from the loop head
    (the target of the loop's backward branch) to the first forward branch after the loop's last MMA (which skips the
    run-end code), then from that branch's target to the backward branch. Instructions, MMAs (HMMA), global loads
    (LDG), cp.async copies (LDGSTS), barriers (BAR) and local-memory (spill) accesses on that path (the loop: the
    innermost backward branch whose body has an MMA); {} where the bundled cuobjdump is missing."""
    from qerl_kernels.gluon_compile import cuobjdump_sass
    sass = cuobjdump_sass(cubin)
    if sass is None:
        return {}
    ins = [(int(a, 16), op, rest) for a, op, rest in
           re.findall(r"/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)([^;]*);", sass)]
    at = {a: i for i, (a, _, _) in enumerate(ins)}

    def target(i):
        t = re.search(r"0x([0-9a-f]+)", ins[i][2]) if ins[i][1].startswith("BRA") else None
        return int(t.group(1), 16) if t else None

    back = [i for i in range(len(ins)) if target(i) is not None and target(i) < ins[i][0] and target(i) in at and
            any(ins[k][1].startswith("HMMA") for k in range(at[target(i)], i))]
    if not back:
        return dict(loop=None, hmma=None, ldg=None, ldgsts=None, bar=None, local=None)
    end = min(back, key=lambda i: i - at[target(i)])  # the innermost (the row-block grid's sits in a row-block loop)
    head = at[target(end)]
    body = list(range(head, end + 1))
    mmas = [i for i in body if ins[i][1].startswith("HMMA")]
    hot = body
    if mmas:
        for i in range(mmas[-1], end):
            t = target(i)
            if t is not None and ins[i][0] < t <= ins[end][0]:
                hot = list(range(head, i + 1)) + list(range(at[t], end + 1))
                break
    ops = [ins[i][1] for i in hot]
    return dict(loop=len(ops), hmma=sum(o.startswith("HMMA") for o in ops), ldg=sum(o.startswith("LDG.") or
                o == "LDG" for o in ops), ldgsts=sum(o.startswith("LDGSTS") for o in ops),
                bar=sum(o.startswith("BAR") for o in ops), local=sum(o.startswith(("LDL", "STL")) for o in ops))


def compile_variant(name: str, arch: int = 90) -> dict:
    """Build one of `compile_variants` for `arch` from CPU tensors (never filled): registers, spills, whether the
    asm's layout is the one the MMA assumes, and the main loop's SASS per word. Must run in a process where the
    Triton interpreter has not run."""
    from qerl_kernels.gluon_compile import ptxas_usage
    try:
        compiled, grid, meta = _build(name, arch)
        use = ptxas_usage(compiled.asm["ptx"], compiled.metadata, arch)
    except Exception as e:  # noqa: BLE001 - reported as the variant's status
        return dict(name=name, status=f"{type(e).__name__}: {str(e).splitlines()[0][:200]}")
    loop = loop_sass(compiled.asm["cubin"])
    per_word = round(loop["loop"] / 16, 1) if loop.get("loop") else None  # a thread decodes 4 rows x 4 words a step
    nw = meta.get("NW", meta.get("KW"))
    return dict(name=name, status="ok", grid=list(grid), NW=nw, CH=meta["CH"], even_k=meta["EVEN_K"],
                regs=use["regs"], spill_st=use["spill_st"],
                spill_ld=use["spill_ld"], layout_ok=check_layout(compiled.asm["ttgir"], nw),
                loop_sass=loop.get("loop"), hmma=loop.get("hmma"), ldg=loop.get("ldg"), ldgsts=loop.get("ldgsts"),
                bar=loop.get("bar"), local=loop.get("local"), maxnreg=meta.get("maxnreg"), sass_per_word=per_word)


def main(argv=None) -> int:
    from qerl_kernels.gluon_compile import variants_main
    return variants_main(argv, "offline sm_90 build of the decode-size MMA kernel (no GPU needed)",
                         list(compile_variants()), compile_variant,
                         lambda r: r["status"] == "ok" and r["layout_ok"])


if __name__ == "__main__":
    raise SystemExit(main())
