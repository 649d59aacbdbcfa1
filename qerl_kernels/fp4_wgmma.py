"""The NVFP4 W4A16 GEMM for RL batch sizes (M 16-512) in Gluon: asynchronous wgmma with the decoded weight as the
register A operand, fed by TMA producers through mbarrier rings, persistent stream-K.

Why (issue 22): at M >= 64 the bf16 baseline is no longer purely bandwidth-bound (H100, kernels.notes.md call 4:
cuBLAS 7B layer 202 us at M = 64, 241 us at M = 256), and the 4-bit kernels there lose to it: the Triton stream-K
kernel 1.27x / 0.67x, the Gluon mma.sync kernel (fp4_gluon) 0.19x at M = 64, its consumers' decode + mma.sync chain
being latency-bound. A 4-bit kernel keeps pace only if the tensor cores run while the weights are decoded: Hopper's
wgmma is asynchronous, so here each consumer warpgroup issues the wgmma of one 64-column group of its decoded tile
and decodes the next group while it runs.

Shape of the kernel (y[M, N] = x[M, K] @ W[N, K]^T * out_scale (+ bias), computed as y^T = W @ x^T, "swap AB"):
1. Tiles: BN weight rows (64 per consumer warpgroup) x MP activation rows (M padded to a power of two, 16..max_mp;
   M above `max_mp` is cut into M blocks of max_mp, the weight tile then decoded once per block). max_mp defaults to
   128: at 256 the [64, 256] fp32 accumulator of a warpgroup (128 registers a thread) leaves the epilogue spilling
   (280 bytes a thread, none in the main loop) and measured slower at M = 256 on an H100 (kernels.notes.md call
   19; faster only on the gate/up group at 512). The (tile, k-step) iterations, tiles ordered weight-tile-major
   (the M blocks of one weight tile are neighbours, so its second read is an L2 hit), are cut into one contiguous
   range per CTA of
   a persistent grid of one CTA per SM (fp4_gluon.stream_k_split): every CTA streams the same weight bytes (+- one
   k-step) whatever the shape, and a tile cut between CTAs is reduced by the last to arrive, in CTA order
   (deterministic; fp4_gluon._flush).
2. Weight producer (1 warp, fp4_gluon's `_fp4_load`): per k-step (BK = 256 columns) one TMA copy of the [BN, 32]
   int32 word tile and one of the [BN, 8] int16 scale tile into a WSTAGES-deep ring (rows of 16 bytes: TMA's minimum,
   hence BK 256).
3. Activation producer (1 warp, `_load_x`): per 128-column chunk one TMA copy of the x tile [MP, 128] (rows past M
   and columns past K read as zeros) into an XSTAGES-deep ring; its own warp so that the weight loads, which come
   from HBM and need the deep ring, never wait behind an x slot that a wgmma still reads.
4. Consumers (the default partition, NUM_WARPS = 4 or 8 warps, one or two warpgroups sharing each x tile; the
   consumer loops over its tiles, and inside over the tile's k-steps): per chunk read its words and scales from the
   weight slot (the second chunk's read frees the slot); per group of KS = 64 columns decode them with the Triton
   kernels' PTX (fp4_gluon._decode -> fp4_decoder._asm) straight into wgmma's A-operand register layout (asserted
   trivial at compile time), issue `warpgroup_mma(a, x_tile^T, acc, use_acc=..., is_async=True)` with B = the x
   tile's columns in shared memory (K-major, a transposed view), then `warpgroup_mma_wait(num_outstanding=1)`: the
   previous group's wgmma is done, its A registers may be reused (kept alive until then through `deps`) and at a
   chunk boundary its x slot is freed, while this group's wgmma overlaps the next group's decode. At a tile's end
   wait for all, flush, and start the next tile from zero through `use_acc` (the accumulator is only ever written
   by wgmma inside the k-step loop; writing zeros there made ptxas serialise the wgmma: kernels.notes.md).
Not done: ping-pong between the two warpgroups (they work on one tile together, "cooperative"; ping-pong would give
each its own tile and overlap one's epilogue with the other's main loop: few epilogues per CTA here), TMA stores,
TMA multicast of the x tile to a CTA pair.

Numerics: identical to the other kernels: decoded weights are exact (w * 2**-62 for bf16, w * 2**-14 for fp16),
products accumulate in fp32 in the tensor cores, the per-row factor (and bias) is applied once to the fp32 result.

Limits (checked on the host with a clear error): NVFP4 single or concatenated weights (PreparedFP4; not
MXFP4, whose uint8 scale rows of one k-step are 8 bytes, under TMA's 16-byte minimum), K_pad a
multiple of 256, K a multiple of 8 (x's row stride is a TMA stride: a multiple of 16 bytes), 1 <= M <= MAX_M,
fp16/bf16 activations, Hopper (sm_90). First GPU run: H200 call 6 (qerl_kernels/kernels.notes.md: exact; 1.2-2x the
default path on the 7B gate/up and down launches at M 128-256, 0.56-0.88x cuBLAS on the layer at M 64-512). In the
default dispatch as one timed candidate for M 65-512 (fp4_launch.forward_candidates); the benchmark times it as
method `nvfp4_wgmma`. Offline build check (no GPU): `python -m qerl_kernels.gluon_compile
--kernel wgmma`.
"""
from __future__ import annotations

import functools

import torch

from qerl_kernels.fp4_gluon import (BK, HAVE_GLUON, check_operands, smem_layout, stream_k_split,
                                    weight_descriptors)
from qerl_kernels.fp4_launch import _device_index, _num_sms, _workspace  # the other kernels' stream-K workspace too
from qerl_kernels.gluon_launch import launch
from qerl_kernels.layout import CHUNK, PreparedFP4

if HAVE_GLUON:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, warpgroup_mma,
                                                                  warpgroup_mma_wait)
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    from qerl_kernels.fp4_gluon import _decode, _flush, _fp4_load, _ring, _scale_layout, _tma_load

__all__ = ["MAX_M", "MAX_PARTS", "SMEM_BUDGET", "fp4_gemm_wgmma", "wgmma_plan", "launch_args", "default_stages",
           "smem_bytes", "check_tma_rows"]

MAX_M = 4096          # M blocks of max_mp each; above ~512 dequantize + cuBLAS is the better path (fp4_launch)
# Stream-K: most CTAs one output tile is cut between. H200 call 6 (kernels.notes.md): with one k-step per CTA the
# k/v launch (512 x 3584, 14 k-steps a tile) took 35-37 us at M = 128-256 (14 partials a tile) and 26 us at M = 512
# (twice the work, 7 partials): the last CTA's serial sum of [BN, MP] fp32 partials bounded the small launches.
MAX_PARTS = 4
SMEM_BUDGET = 227 * 1024   # Hopper: shared memory one CTA may use

if HAVE_GLUON:
    _BK = gl.constexpr(BK)

    @gluon.jit
    def _load_x(x_desc, x_bufs, x_ready, x_empty, TOTAL, PER, K_STEPS, M_BLOCKS,
                MP: gl.constexpr, XSTAGES: gl.constexpr, STEP: gl.constexpr = 256):
        """Activation producer warp: TMA copies of the x tile [MP, box] (the descriptor's box: 128 columns here) of
        every box of the STEP columns of each of this CTA's iterations (fp4_wgmma_t's grad_y: one box of BNR a
        step)."""
        u0 = gl.program_id(0) * PER
        u1 = gl.minimum(u0 + PER, TOTAL)
        nbytes: gl.constexpr = x_desc.block_type.nbytes
        BOX: gl.constexpr = x_desc.block_type.shape[1]
        for it in range(u0, u1):
            tile = it // K_STEPS
            ks = it - tile * K_STEPS
            m0 = (tile % M_BLOCKS) * MP
            for h in gl.static_range(STEP // BOX):
                slot, phase = _ring((it - u0) * (STEP // BOX) + h, XSTAGES)
                mbarrier.wait(x_empty.index(slot), phase ^ 1)
                mbarrier.expect(x_ready.index(slot), nbytes)
                _tma_load(x_desc, [m0, ks * STEP + h * BOX], x_ready.index(slot), x_bufs.index(slot))

    @gluon.constexpr_function
    def _word_layout(BN, NUM_WARPS):
        """Register layout of one chunk's words [BN, 16] int32 (index 4c + b): lane 4g + c of warp w holds words
        4c..4c + 3 of rows 16w + g and 16w + g + 8 (4 registers a row), i.e. wgmma's k_width-2 A fragment of the
        chunk's 128 columns once each word is decoded to 8 values (asserted where the decoded tile becomes the A
        operand). Written out because DotOperandLayout(k_width=4) on a 16-word tile holds every word twice (its
        instruction k is 32 words)."""
        BN, NUM_WARPS = int(BN), int(NUM_WARPS)
        warps = [[16 << i, 0] for i in range(NUM_WARPS.bit_length() - 1)]
        reps = [[(16 * NUM_WARPS) << j, 0] for j in range((BN // (16 * NUM_WARPS)).bit_length() - 1)]
        return gl.DistributedLinearLayout(reg_bases=[[0, 1], [0, 2], [8, 0]] + reps,
                                          lane_bases=[[0, 4], [0, 8], [1, 0], [2, 0], [4, 0]], warp_bases=warps,
                                          block_bases=[], shape=[BN, 16])

    @gluon.jit
    def _half(t, q: gl.constexpr):
        """Half q (0 or 1) of a chunk's words [BN, 16] (index 4c + b) or scales [BN, 4] (index b): the entries with
        b = 2q, 2q + 1, i.e. columns 64q..64q + 63 of the chunk, as [BN, 8] (index 2c + b') or [BN, 2]; each thread
        keeps its own registers (no data movement)."""
        n: gl.constexpr = t.shape[1] // 4          # 4 lane-quad positions c (words) or 1 (scales)
        BN: gl.constexpr = t.shape[0]
        if n == 1:
            t3 = gl.permute(gl.reshape(t, [BN, 2, 2]), (0, 2, 1))                 # [n, b', bh]
        else:
            t3 = gl.permute(gl.reshape(t, [BN, 4, 2, 2]), (0, 1, 3, 2))           # [n, c, b', bh]
        a, b = gl.split(t3)
        if q == 0:
            return gl.reshape(a, [BN, 2 * n])
        return gl.reshape(b, [BN, 2 * n])

    @gluon.jit
    def _quarter(t, p: gl.constexpr):
        """Quarter p (0..3) of a chunk's words [BN, 16] or scales [BN, 4]: word / scale b = p of each lane quad,
        i.e. columns 32p..32p + 31 of the chunk, as [BN, 4] (index c) or [BN, 1]; each thread keeps its own
        registers (two `_half` splits)."""
        h = _half(t, p // 2)                      # [BN, 8] (index 2c + b') or [BN, 2] (index b')
        BN: gl.constexpr = h.shape[0]
        n: gl.constexpr = h.shape[1] // 2
        a, b = gl.split(gl.reshape(h, [BN, n, 2]))
        if p % 2 == 0:
            return a
        return b

    @gluon.jit
    def _mma_group(acc, a_prev, a_prev2, w, s, x_bufs, x_ready, x_empty, j, q: gl.constexpr, cont, free_prev,
                   a_l: gl.constexpr, BN: gl.constexpr, KS: gl.constexpr, XSTAGES: gl.constexpr, BF16: gl.constexpr,
                   OUT: gl.constexpr):
        """One wgmma group: decode KS columns (part q of chunk j's 128) into A registers, issue their wgmma on x
        slot j, then wait until at most OUT wgmmas are in flight (OUT 1: the previous group's is retired; OUT 2: the
        one before it, so two run while the next group decodes). `cont`: the previous group of this CTA belongs to
        the same tile: the wgmma accumulates onto acc (else it starts from zero: use_acc). The previous chunk's x
        slot is freed once its last group is retired: with OUT 1 here at q = 0 (if `cont`), with OUT 2 at q = 1 (if
        `free_prev`, this chunk's first group continued a tile); one at a tile's end is freed there. The A tiles
        still in flight are kept alive through `deps`. Returns (acc, this group's A, the A to carry as a_prev2)."""
        a = gl.convert_layout(_decode(w, s, BN, BF16, KS // 32), a_l, assert_trivial=True)
        slot, phase = _ring(j, XSTAGES)
        if q == 0:
            mbarrier.wait(x_ready.index(slot), phase)
        xt = x_bufs.index(slot)
        if KS < 128:
            xt = xt.slice(q * KS, KS, dim=1)
        # a tile's first group starts from zero through use_acc, not by zeroing acc: the accumulator registers are
        # then only ever written by wgmma inside the loop, so ptxas need not insert a full wait at the loop's back
        # edge (with zeros written there it did: "warpgroup.wait is injected", C7517, losing the overlap)
        acc = warpgroup_mma(a, xt.permute((1, 0)), acc, use_acc=cont, is_async=True)
        if OUT == 1:
            # the previous group's wgmma is complete after this wait; its A registers are kept alive until here
            acc, a_prev = warpgroup_mma_wait(num_outstanding=1, deps=[acc, a_prev])
            if q == 0:
                if cont:
                    mbarrier.arrive(x_empty.index((j + XSTAGES - 1) % XSTAGES), count=1)
            keep = a_prev2
        else:
            # the group before the previous one is complete; the previous group's A stays alive (carried)
            acc, a_prev, a_prev2 = warpgroup_mma_wait(num_outstanding=2, deps=[acc, a_prev, a_prev2])
            if q == 1:
                if free_prev:
                    mbarrier.arrive(x_empty.index((j + XSTAGES - 1) % XSTAGES), count=1)
            keep = a_prev
        return acc, a, keep

    @gluon.jit
    def _wgmma_consumer(x_bufs, w_bufs, s_bufs, x_ready, x_empty, w_ready, w_empty, os_ptr, bias_ptr, y_ptr, ws_ptr,
                        cnt_ptr, M, N, TOTAL, PER, K_STEPS, M_BLOCKS, stride_ym,
                        BN: gl.constexpr, MP: gl.constexpr, WSTAGES: gl.constexpr, XSTAGES: gl.constexpr,
                        BF16: gl.constexpr, HAS_BIAS: gl.constexpr, NUM_WARPS: gl.constexpr, KS: gl.constexpr,
                        OUT: gl.constexpr):
        """Consumer warpgroups: decode + async wgmma per chunk, accumulate the tile in fp32, flush at tile ends."""
        mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[NUM_WARPS, 1],
                                                      instr_shape=[16, MP, 16])
        a_l: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=2)
        w_l: gl.constexpr = _word_layout(BN, NUM_WARPS)
        s_l: gl.constexpr = _scale_layout(BN, NUM_WARPS, 1)
        adt: gl.constexpr = gl.bfloat16 if BF16 else gl.float16
        NCH: gl.constexpr = _BK // 128   # 128-column chunks (x tiles) per k-step; 128 // KS wgmma groups each
        u0 = gl.program_id(0) * PER
        u1 = gl.minimum(u0 + PER, TOTAL)
        t_first = u0 // K_STEPS
        rbn = gl.arange(0, BN, layout=gl.SliceLayout(1, mma))
        rm = gl.arange(0, MP, layout=gl.SliceLayout(0, mma))
        acc = gl.zeros([BN, MP], gl.float32, mma)
        a_prev = gl.zeros([BN, KS], adt, a_l)
        a_prev2 = gl.zeros([BN, KS], adt, a_l)  # OUT 2 only (with OUT 1 passed through unchanged, folded away)
        # outer loop over this CTA's tiles, inner over the tile's k-steps in its range: the accumulator is then
        # carried through the inner loop written only by wgmma, and waited for and flushed between the loops (a
        # flush under a condition inside one flat loop made the compiler copy in-flight accumulator registers at the
        # join, and ptxas injected a full wgmma wait per k-step: C7517, the decode / wgmma overlap lost)
        for tile in range(t_first, (u1 - 1) // K_STEPS + 1):
            k0 = gl.maximum(u0, tile * K_STEPS)
            k1 = gl.minimum(u1, (tile + 1) * K_STEPS)
            for it in range(k0, k1):
                i = it - u0
                slot, phase = _ring(i, WSTAGES)
                mbarrier.wait(w_ready.index(slot), phase)
                for h in gl.static_range(NCH):
                    # the chunk's words and scales, read when needed (the next chunk's are not held through this
                    # one's decode); the last chunk's read frees the weight slot
                    w = w_bufs.index(slot).slice(16 * h, 16, dim=1).load(w_l)   # [BN, 16] int32, words 4c + b
                    s = s_bufs.index(slot).slice(4 * h, 4, dim=1).load(s_l)     # [BN, 4] int16, scales b
                    if h == NCH - 1:
                        fence_async_shared()        # order the shared reads before the producer's next TMA write
                        mbarrier.arrive(w_empty.index(slot), count=1)
                    # a group continues the tile's accumulation unless it is the tile's first in this CTA
                    cont = (it > k0) | (h > 0)
                    if KS == 128:
                        acc, a_prev, a_prev2 = _mma_group(acc, a_prev, a_prev2, w, s, x_bufs, x_ready, x_empty,
                                                          i * NCH + h, 0, cont, cont, a_l, BN, KS, XSTAGES, BF16, OUT)
                    elif KS == 32:  # four groups a chunk: the smallest A tile (8 registers a thread), for MP = 256
                        acc, a_prev, a_prev2 = _mma_group(acc, a_prev, a_prev2, _quarter(w, 0), _quarter(s, 0),
                                                          x_bufs, x_ready, x_empty, i * NCH + h, 0, cont, cont, a_l,
                                                          BN, KS, XSTAGES, BF16, OUT)
                        for p in gl.static_range(1, 4):
                            acc, a_prev, a_prev2 = _mma_group(acc, a_prev, a_prev2, _quarter(w, p), _quarter(s, p),
                                                              x_bufs, x_ready, x_empty, i * NCH + h, p, True, cont,
                                                              a_l, BN, KS, XSTAGES, BF16, OUT)
                    else:
                        acc, a_prev, a_prev2 = _mma_group(acc, a_prev, a_prev2, _half(w, 0), _half(s, 0), x_bufs,
                                                          x_ready, x_empty, i * NCH + h, 0, cont, cont, a_l, BN, KS,
                                                          XSTAGES, BF16, OUT)
                        acc, a_prev, a_prev2 = _mma_group(acc, a_prev, a_prev2, _half(w, 1), _half(s, 1), x_bufs,
                                                          x_ready, x_empty, i * NCH + h, 1, True, cont, a_l, BN, KS,
                                                          XSTAGES, BF16, OUT)
            if OUT == 1:
                acc, a_prev = warpgroup_mma_wait(num_outstanding=0, deps=[acc, a_prev])
            else:
                acc, a_prev, a_prev2 = warpgroup_mma_wait(num_outstanding=0, deps=[acc, a_prev, a_prev2])
            # the tile's last chunk's x slot (its last group is retired now); the others were freed in _mma_group
            mbarrier.arrive(x_empty.index(((k1 - 1 - u0) * NCH + NCH - 1) % XSTAGES), count=1)
            # the tile's rows of W and of x, and its partial's offsets in the workspace ([BN, MP] int32), from the
            # tile index here: computed once before the loops they were held through the main loop (at MP = 128
            # ~100 registers a thread: spills)
            rn = (tile // M_BLOCKS) * BN + rbn
            rmt = (tile % M_BLOCKS) * MP + rm
            ws_tile = gl.expand_dims(rn % BN, 1) * MP + gl.expand_dims(rmt % MP, 0)
            acc = _flush(acc, tile, u0, u1, t_first, PER, K_STEPS, os_ptr, bias_ptr, y_ptr, ws_ptr, cnt_ptr, rn,
                         rmt, ws_tile, M, N, stride_ym, BN, MP, HAS_BIAS)
            # nothing is in flight now: the last A tiles need not be held through the flush (their registers free)
            a_prev = gl.zeros([BN, KS], adt, a_l)
            if OUT == 2:
                a_prev2 = gl.zeros([BN, KS], adt, a_l)

    @gluon.jit
    def _fp4_gemm_wgmma(w_desc, s_desc, x_desc, os_ptr, bias_ptr, y_ptr, ws_ptr, cnt_ptr,
                        M, N, TOTAL, PER, K_STEPS, M_BLOCKS, stride_ym,
                        BN: gl.constexpr, MP: gl.constexpr, WSTAGES: gl.constexpr, XSTAGES: gl.constexpr,
                        BF16: gl.constexpr, HAS_BIAS: gl.constexpr, NUM_WARPS: gl.constexpr, KS: gl.constexpr,
                        LOAD_REGS: gl.constexpr, OUT: gl.constexpr = 1):
        w_bufs = gl.allocate_shared_memory(gl.int32, [WSTAGES, BN, _BK // 8], w_desc.layout)
        s_bufs = gl.allocate_shared_memory(gl.int16, [WSTAGES, BN, _BK // 32], s_desc.layout)
        x_bufs = gl.allocate_shared_memory(x_desc.dtype, [XSTAGES, MP, 128], x_desc.layout)
        w_ready = gl.allocate_shared_memory(gl.int64, [WSTAGES, 1], mbarrier.MBarrierLayout())
        w_empty = gl.allocate_shared_memory(gl.int64, [WSTAGES, 1], mbarrier.MBarrierLayout())
        x_ready = gl.allocate_shared_memory(gl.int64, [XSTAGES, 1], mbarrier.MBarrierLayout())
        x_empty = gl.allocate_shared_memory(gl.int64, [XSTAGES, 1], mbarrier.MBarrierLayout())
        for j in gl.static_range(WSTAGES):
            mbarrier.init(w_ready.index(j), count=1)
            mbarrier.init(w_empty.index(j), count=1)
        for j in gl.static_range(XSTAGES):
            mbarrier.init(x_ready.index(j), count=1)
            mbarrier.init(x_empty.index(j), count=1)
        gl.warp_specialize([
            (_wgmma_consumer, (x_bufs, w_bufs, s_bufs, x_ready, x_empty, w_ready, w_empty, os_ptr, bias_ptr, y_ptr,
                               ws_ptr, cnt_ptr, M, N, TOTAL, PER, K_STEPS, M_BLOCKS, stride_ym,
                               BN, MP, WSTAGES, XSTAGES, BF16, HAS_BIAS, NUM_WARPS, KS, OUT)),
            (_fp4_load, (w_desc, s_desc, w_bufs, s_bufs, w_ready, w_empty, TOTAL, PER, K_STEPS, M_BLOCKS, BN, WSTAGES)),
            (_load_x, (x_desc, x_bufs, x_ready, x_empty, TOTAL, PER, K_STEPS, M_BLOCKS, MP, XSTAGES)),
        ], [1, 1], [LOAD_REGS, LOAD_REGS])


def smem_bytes(bn: int, mp: int, wstages: int, xstages: int) -> int:
    """Shared memory of one CTA's rings (words + scales per weight stage, the x tile per activation stage, the
    barriers); the compiled kernel's figure (gluon_compile) adds alignment only."""
    return wstages * bn * (BK // 2 + BK // 16) + xstages * mp * 128 * 2 + 16 * (wstages + xstages)


@functools.lru_cache(maxsize=None)
def default_stages(bn: int, mp: int) -> tuple[int, int]:
    """(WSTAGES, XSTAGES) when the caller names none: the weight ring as deep as fits beside enough x stages (the
    x tile is [MP, 128] bf16: 64 KiB at MP = 256), so at M <= 64 (memory-bound) ~6 k-steps of weights are in
    flight per SM and at MP = 256 (compute-bound, a chunk takes ~1 us of wgmma) two x stages suffice."""
    xstages = {16: 4, 32: 4, 64: 4, 128: 3, 256: 2}[mp]
    wstages = 6
    while wstages > 2 and smem_bytes(bn, mp, wstages, xstages) > SMEM_BUDGET - 2048:
        wstages -= 1
    return wstages, xstages


@functools.lru_cache(maxsize=4096)
def wgmma_plan(n_pad: int, k_pad: int, m: int, sms: int, bn: int = 128, max_mp: int = 128) -> dict:
    """Stream-K split of one launch (pure arithmetic, testable on CPU): MP = M padded to a power of two in
    16..max_mp, M_BLOCKS = ceil(M / MP), tiles = N_pad / bn * M_BLOCKS, iterations = tiles * K_STEPS cut into one
    contiguous range of PER (>= K_STEPS / MAX_PARTS) per CTA, grid <= sms (one CTA per SM). Returns {MP, M_BLOCKS,
    tiles, K_STEPS, TOTAL, PER, grid}. Cached (an eager launch's host time): the dict is shared, read it only.

    Raises:
        ValueError: K_pad not a multiple of BK, N_pad not a multiple of bn, or M outside 1..MAX_M.
    """
    if k_pad % BK or n_pad % bn or not 1 <= m <= MAX_M:
        raise ValueError(f"fp4_gemm_wgmma: needs K_pad % {BK} == 0, N_pad % {bn} == 0 and 1 <= M <= {MAX_M}; got "
                         f"K_pad={k_pad}, N_pad={n_pad}, M={m}")
    mp = min(max_mp, max(16, 1 << (m - 1).bit_length()))
    m_blocks = -(-m // mp)
    tiles, k_steps = n_pad // bn * m_blocks, k_pad // BK
    total = tiles * k_steps
    # at least K_STEPS / MAX_PARTS k-steps per CTA, so at most ~MAX_PARTS + 1 CTAs share a tile: its last CTA sums
    # the others' partials one after another (fp4_gluon._flush)
    per, grid = stream_k_split(total, sms, -(-k_steps // MAX_PARTS))
    return dict(MP=mp, M_BLOCKS=m_blocks, tiles=tiles, K_STEPS=k_steps, TOTAL=total, PER=per, grid=grid)


def launch_args(x: torch.Tensor, w: PreparedFP4, bias: torch.Tensor | None, y: torch.Tensor, sms: int, *,
                num_warps: int = 8, max_mp: int = 128, ks: int = 64, wstages: int | None = None,
                xstages: int | None = None, load_regs: int = 24, outstanding: int = 1) -> tuple[int, tuple, dict]:
    """(grid, positional arguments, meta-parameters) of one `_fp4_gemm_wgmma` launch computing y = x @ W^T (+ bias).

    The one place that turns the knobs into a launch: fp4_gemm_wgmma launches what it returns and the offline
    compile check (gluon_compile.py) compiles it from CPU tensors of the same shapes and dtypes. Knobs: num_warps,
    consumer warps (4 or 8: one or two warpgroups, BN = 16 * num_warps weight rows per tile); max_mp, the largest
    M block (a power of two, 16..256: wgmma's N); ks, the columns of one wgmma group (32, 64 or 128: the decoded A
    tile of a group, and of the one in flight beside it, is ks / 4 registers a thread); wstages / xstages, the
    depths of the weight and activation rings (default `default_stages`); load_regs, each producer warp's
    registers (24, the least: the consumers get 240 and the default build has no spills at M = 128; at 40 they get
    232 and spill in the epilogue); outstanding, the wgmmas a warpgroup keeps in flight while it decodes the next
    group (1, or 2 with ks <= 64: one more A tile held, the x slot freed a group later).

    Raises:
        ValueError: a knob, shape or layout the kernel does not support (the message names it).
    """
    m, k = x.shape
    if (num_warps not in (4, 8) or max_mp not in (16, 32, 64, 128, 256) or ks not in (32, 64, 128) or load_regs % 8
            or not 24 <= load_regs <= 256 or outstanding not in (1, 2) or (outstanding == 2 and ks == 128)):
        raise ValueError(f"fp4_gemm_wgmma: needs num_warps 4 or 8 (whole warpgroups), max_mp a power of two in "
                         f"16..256, ks 32, 64 or 128, load_regs a multiple of 8 in 24..256 and outstanding 1 or 2 "
                         f"(2 with ks <= 64); got num_warps={num_warps}, max_mp={max_mp}, ks={ks}, "
                         f"load_regs={load_regs}, outstanding={outstanding}")
    bn = 16 * num_warps
    n_pad, k_pad = w.words.shape[0], w.words.shape[1] * 8
    plan = wgmma_plan(n_pad, k_pad, m, sms, bn, max_mp)
    mp = plan["MP"]
    dw, dx = default_stages(bn, mp)
    wstages, xstages = wstages or dw, xstages or dx
    if not 2 <= wstages <= 8 or not 2 <= xstages <= 8 or smem_bytes(bn, mp, wstages, xstages) > SMEM_BUDGET:
        raise ValueError(f"fp4_gemm_wgmma: needs 2..8 stages per ring within {SMEM_BUDGET} bytes of shared memory; "
                         f"got wstages={wstages}, xstages={xstages}: {smem_bytes(bn, mp, wstages, xstages)} bytes at "
                         f"BN={bn}, MP={mp}")
    check_tma_rows("fp4_gemm_wgmma", "x", "K", x)
    ws, cnt = _workspace(x.device, 2 * plan["grid"] * bn * mp, plan["tiles"])  # 2 partial tiles per CTA
    # TMA tiles: per k-step [bn, 32] int32 words (128-byte rows, 128-byte swizzle) and [bn, 8] int16 scales (16-byte
    # rows, TMA's minimum); per chunk the x tile [MP, 128] (rows past M and columns past K are filled with zeros)
    bf16 = x.dtype == torch.bfloat16
    w_desc, s_desc = weight_descriptors(w, bn)
    x_desc = TensorDescriptor.from_tensor(x, [mp, CHUNK], smem_layout(mp, CHUNK, "bfloat16" if bf16 else "float16"))
    os_row = w.out_scales[int(bf16)]
    args = (w_desc, s_desc, x_desc, os_row, bias if bias is not None else os_row, y, ws, cnt,
            m, w.n, plan["TOTAL"], plan["PER"], plan["K_STEPS"], plan["M_BLOCKS"], y.stride(0))
    meta = dict(BN=bn, MP=mp, WSTAGES=wstages, XSTAGES=xstages, BF16=bf16, HAS_BIAS=bias is not None,
                NUM_WARPS=num_warps, KS=ks, LOAD_REGS=load_regs, OUT=outstanding, num_warps=num_warps,
                maxnreg=_max_regs(num_warps))
    return plan["grid"], args, meta


def check_tma_rows(kernel: str, name: str, cols: str, t: torch.Tensor) -> None:
    """The 2-byte [rows, cols] operand `name` read by TMA boxes (this kernel's x, fp4_wgmma_t's grad_y): a multiple of
    8 columns, unit column stride, a row stride of a multiple of 16 bytes, a 16-byte aligned start. Raises
    ValueError naming `kernel`, the operand and what is wrong."""
    if t.shape[1] % 8 or t.stride(1) != 1 or t.stride(0) % 8 or t.data_ptr() % 16:
        raise ValueError(f"{kernel}: {name} is read by TMA: needs {cols} % 8 == 0, unit column stride, a row stride "
                         f"of a multiple of 16 bytes and a 16-byte aligned start; got shape {tuple(t.shape)}, strides "
                         f"{tuple(t.stride())}")


def _tma_rows(x: torch.Tensor) -> torch.Tensor:
    """x as the TMA descriptor reads it: unit column stride, a row stride of a multiple of 16 bytes, a 16-byte
    aligned start; copied when it is not (a view at an odd offset, or one row of a wider buffer: `contiguous()`
    and `clone()` keep a size-1 dimension's stride, e.g. (3590, 1) for x = buf[:1, :3584])."""
    x = x.contiguous()
    if x.data_ptr() % 16 or x.stride(0) % 8:
        x = x.clone(memory_format=torch.contiguous_format)
    return x


def _max_regs(num_warps: int) -> int:
    """Registers per thread for one CTA per SM: the consumer warps plus one warpgroup for the two producer warps
    share the SM's 64 Ki registers; a multiple of 8, at most 232 (setmaxnreg then moves the producers' share to
    the consumers)."""
    return min(232, 65536 // ((num_warps + 4) * 32) // 8 * 8)


def fp4_gemm_wgmma(x: torch.Tensor, w: PreparedFP4, bias: torch.Tensor | None = None, **knobs) -> torch.Tensor:
    """y = x @ W^T (+ bias) for a prepared NVFP4 weight and x [M, K] fp16/bf16 on a Hopper GPU, 1 <= M <= MAX_M.

    knobs: see `launch_args` (num_warps, max_mp, ks, wstages, xstages, load_regs), the one place that holds their
    defaults, so the offline compile check builds what this launches.

    Raises:
        RuntimeError: Gluon is not available, or the GPU is not a Hopper (sm_90: wgmma).
        ValueError: unsupported weight (MXFP4), shape, dtype, layout or knob, or x not on the weight's
            device (the message names it).
    """
    if not HAVE_GLUON:
        raise RuntimeError("fp4_gemm_wgmma: triton.experimental.gluon (Hopper TMA / mbarrier / wgmma) is not "
                           "available")
    check_operands("fp4_gemm_wgmma", x, w, bias)
    index = _device_index(x)
    cap = _capability(index)
    if cap[0] != 9:
        raise RuntimeError(f"fp4_gemm_wgmma: wgmma needs a Hopper GPU (sm_90), got sm_{cap[0]}{cap[1]} "
                           f"({torch.cuda.get_device_name(x.device)})")
    y = torch.empty(x.shape[0], w.n, device=x.device, dtype=x.dtype)
    if x.shape[0] == 0:
        return y
    x = _tma_rows(x)
    bias = bias.contiguous() if bias is not None else None
    grid, args, meta = launch_args(x, w, bias, y, _num_sms(index), **knobs)
    launch(_fp4_gemm_wgmma, grid, args, meta)
    return y


@functools.lru_cache(maxsize=None)
def _capability(index: int) -> tuple[int, int]:
    """The device's compute capability, asked once (the Gluon launches run eagerly in training and in the dispatch's
    timing, where their host time counts)."""
    return torch.cuda.get_device_capability(index)
