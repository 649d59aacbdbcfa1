"""The backward input gradient of the NVFP4 W4A16 linear, grad_x = grad_y @ W, in Gluon with asynchronous wgmma:
the decoded weight tile as wgmma's A operand from shared memory (read transposed), fed by TMA rings, stream-K.

Why (issue 22, "the backward (grad_y @ W) through the same machinery", target >= 1.0x bf16 at every M): the backward
had two paths, the Triton transposed kernel (fp4_triton._fp4_gemm_t, decode-size M) and the dequantize kernel +
cuBLAS, which writes and re-reads the whole bf16 weight (2 + 2 bytes a weight beside the 0.56 it reads packed):
1.8x bf16's time at M 128-256 (H200 run 4). Here the packed weight is read once per M block and decoded on the
fly, the tensor cores running while the next tile is decoded.

Shape of the kernel (o[M, K] = g[M, N] @ W[N, K] * out_scale, computed as o^T = W^T @ g^T, "swap AB"):
1. Tiles: 256 output columns of W (k) x MP rows of g (M padded to a power of two, 16..max_mp; larger M in M blocks,
   the weight tile then decoded once per block, its second read an L2 hit: tiles are ordered weight-tile-major).
   The reduction runs over W's rows n in steps of BNR (64 or 128). The (tile, n-step) iterations are cut into one
   contiguous range per CTA of a persistent grid of one CTA per SM (fp4_gluon.stream_k_split, at least
   N_STEPS / MAX_PARTS steps a CTA), a tile cut between CTAs reduced by the last to arrive (fp4_gluon._flush).
2. Weight producer (1 warp, fp4_gluon's `_fp4_load`, TRANSPOSED): per step one TMA copy of the [BNR, 32] int32
   word tile (rows n, 256 columns k) and one of the [BNR, 8] int16 scale tile (16-byte rows: TMA's minimum, hence
   256 output columns a tile).
3. Gradient producer (1 warp, fp4_wgmma's `_load_x` with STEP = BNR): per step one TMA copy of g's [MP, BNR]
   tile (rows past M, columns past N: zeros).
4. Consumers (8 warps, two warpgroups; `split`, the default: two partitions of one warpgroup, each with its own
   barriers, partials and counters, else one partition of both): each warpgroup decodes exactly the output columns
   (wgmma's M rows) its own wgmma reads (split: 128-column chunk h, the forward kernel's layouts; one partition:
   columns 64h..64h+63 of each chunk, the words b = 2h, 2h + 1 of each lane quad, `_layout_t`) and stores them as
   bf16 / fp16 into one of two shared-memory buffers; after a fence and a barrier `warpgroup_mma(buffer^T,
   g_tile^T [BNR, MP], acc)` runs asynchronously while the next step is decoded into the other buffer. The wait
   with one group in flight (`warpgroup_mma_wait(1)`) retires the previous step, so its decode buffer, read only by
   this warpgroup's wgmma, may be written at the next step; its g slot, read by every warpgroup, is freed one
   barrier later (by each partition: the slots' barriers count the partitions).
Measured (H100, qerl_kernels/kernels.notes.md calls 95-100): exact; 7B gate / down at M = 256 107.1 / 96.5 us
against the other paths' 131.6 / 124.6 and bf16 cuBLAS's 62.5 / 59.4; eagerly ~105 us of host time a call.
Numerics: as the forward kernels: the decoded weights are exact, products accumulate in fp32 in the tensor cores,
the weight's one factor (a single weight: every row's is the same) is applied once to the fp32 result.

Limits (host checks with a clear error): NVFP4 single weights (not groups, whose rows carry different factors along
the reduction, not MXFP4, whose 8-byte scale rows TMA cannot copy), K_pad a multiple of 256, N a multiple of 8 (g's
row stride is a TMA stride), 1 <= M <= MAX_M, fp16/bf16, Hopper. In `fp4_gemm_t`'s timed choice as path "wgmma"
(fp4_launch; QERL_FP4_WGMMA=0 leaves it out); the benchmark times it as `nvfp4_bwd_wgmma`. Offline build check
(no GPU): `python -m qerl_kernels.gluon_compile --kernel wgmma_t`.
"""
from __future__ import annotations

import functools

import torch

from qerl_kernels.fp4_gluon import (BK, HAVE_GLUON, check_operands, smem_layout, stream_k_split,
                                    weight_descriptors)
from qerl_kernels.fp4_launch import _device_index, _num_sms, _workspace
from qerl_kernels.fp4_wgmma import _capability, _max_regs, _tma_rows, check_tma_rows
from qerl_kernels.gluon_launch import launch
from qerl_kernels.layout import PreparedFP4

if HAVE_GLUON:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, warpgroup_mma,
                                                                  warpgroup_mma_wait)
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    from qerl_kernels.fp4_gluon import _cta_barrier, _decode, _flush, _fp4_load, _ring, _scale_layout
    from qerl_kernels.fp4_wgmma import _load_x, _word_layout

__all__ = ["MAX_M", "MAX_PARTS", "SMEM_BUDGET", "NUM_WARPS", "fp4_gemm_t_wgmma", "wgmma_t_plan", "launch_args",
           "smem_bytes", "default_stages", "default_knobs"]

MAX_M = 4096
# most CTAs one output tile is cut between (the last sums the others' [256, MP] fp32 partials one after another): the
# output has few tiles (7B: K / 256 = 14 per M block) over long reductions (296 steps of 64 rows for gate), so at 4
# (the forward kernel's) the gate weight at M = 64 ran on 56 of 132 SMs (H100 call 95)
MAX_PARTS = 8
SMEM_BUDGET = 227 * 1024      # Hopper: shared memory one CTA may use
NUM_WARPS = 8                 # two consumer warpgroups: 256 output columns a tile, 128 a warpgroup
# registers of the second consumer partition (split; the first gets the rest: 240 too); offline sm_90 builds (Triton
# 3.6) with M blocks of 128: at 232 the gate weight at M = 256 spilled in the main loop (12 / 16 bytes), at 240 it
# spills nothing, a ragged M (200) 12 / 20 bytes with 6 local loads / stores in its loop
CONSUMER_REGS = 240
TILE_K = BK                   # output columns of W a tile (the scale tile's 16-byte TMA rows)

if HAVE_GLUON:
    _TK = gl.constexpr(TILE_K)

    @gluon.constexpr_function
    def _layout_t(BNR, COLS):
        """Register layout of one step's words [BNR, 32] int32 (COLS 32; index 16h + 4c + b: chunk h, lane quad
        position c, word b) or scales [BNR, 8] int16 (COLS 8; index 4h + b): lane 4g + c of warp w holds, of rows
        16(w % 4) + g (+ 8, + 64 ...), words b = 2(w // 4), 2(w // 4) + 1 of both chunks, so warpgroup w // 4
        decodes columns 64(w // 4)..+63 of each chunk: the output columns its wgmma computes (the accumulator's rows
        16w..16w + 15 of each 128); 8 words a thread at BNR = 64. The scales' layout is the words' with the
        lane-quad dimension c sliced off (the decode broadcasts each scale over c without moving data)."""
        BNR, COLS = int(BNR), int(COLS)
        reps = [[64 << j, 0] for j in range((BNR // 64).bit_length() - 1)]
        chunk = COLS // 2                              # the index step of chunk h
        lanes = [[0, 4], [0, 8]] if COLS == 32 else [[0, 0], [0, 0]]
        return gl.DistributedLinearLayout(reg_bases=[[0, 1], [8, 0], [0, chunk]] + reps,
                                          lane_bases=lanes + [[1, 0], [2, 0], [4, 0]],
                                          warp_bases=[[16, 0], [32, 0], [0, 2]], block_bases=[], shape=[BNR, COLS])

    @gluon.jit
    def _t_consumer(w_bufs, s_bufs, g_bufs, a_bufs, w_ready, w_empty, g_ready, g_empty, os_ptr, o_ptr, ws_ptr,
                    cnt_ptr, M, K, TOTAL, PER, N_STEPS, M_BLOCKS, stride_om, WS_PART, TILES,
                    H: gl.constexpr, NWG: gl.constexpr, BNR: gl.constexpr, MP: gl.constexpr,
                    WSTAGES: gl.constexpr, GSTAGES: gl.constexpr, BF16: gl.constexpr):
        """A consumer partition of NWG warpgroups computing output columns 128H..128(H + NWG) - 1 of each tile:
        decode each step's weight columns into a shared buffer, async wgmma from it, flush at tile ends. NWG 2
        (H 0): both warpgroups in one partition, lock-stepped by its barriers; NWG 1 (H 0 and 1, two partitions):
        each warpgroup with its own barriers, partials and counters."""
        TKW: gl.constexpr = 128 * NWG
        mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4 * NWG, 1],
                                                      instr_shape=[16, MP, 16])
        u0 = gl.program_id(0) * PER
        u1 = gl.minimum(u0 + PER, TOTAL)
        t_first = u0 // N_STEPS
        rbk = gl.arange(0, TKW, layout=gl.SliceLayout(1, mma))
        rm = gl.arange(0, MP, layout=gl.SliceLayout(0, mma))
        acc = gl.zeros([TKW, MP], gl.float32, mma)
        for tile in range(t_first, (u1 - 1) // N_STEPS + 1):
            s0 = gl.maximum(u0, tile * N_STEPS)
            s1 = gl.minimum(u1, (tile + 1) * N_STEPS)
            for it in range(s0, s1):
                i = it - u0
                slot, phase = _ring(i, WSTAGES)
                mbarrier.wait(w_ready.index(slot), phase)
                if NWG == 2:   # [BNR, 32] words, [BNR, 8] scales: each warpgroup its columns of both chunks
                    w = w_bufs.index(slot).load(_layout_t(BNR, 32))
                    s = s_bufs.index(slot).load(_layout_t(BNR, 8))
                else:          # chunk H: [BNR, 16] words, [BNR, 4] scales in the forward kernel's layouts
                    w = w_bufs.index(slot).slice(16 * H, 16, dim=1).load(_word_layout(BNR, 4))
                    s = s_bufs.index(slot).slice(4 * H, 4, dim=1).load(_scale_layout(BNR, 4, 1))
                # [BNR, TKW]: rows n, this partition's columns k; the buffer this step writes was last read by its
                # wgmma two steps ago, retired by the wait one step ago
                a_buf = a_bufs.index(2 * H + i % 2)
                a_buf.store(_decode(w, s, BNR, BF16))
                fence_async_shared()   # the shared reads and the generic-proxy stores before async-proxy accesses
                _cta_barrier()         # the partition's warps
                # every warp of the partition has read this step's weight slot and retired its wgmma of two steps
                # ago: this partition's share of both slots is free (each slot waits for every partition)
                mbarrier.arrive(w_empty.index(slot), count=1)
                if it - 2 >= s0:
                    mbarrier.arrive(g_empty.index((i + GSTAGES - 2) % GSTAGES), count=1)
                gslot, gphase = _ring(i, GSTAGES)
                mbarrier.wait(g_ready.index(gslot), gphase)
                acc = warpgroup_mma(a_buf.permute((1, 0)), g_bufs.index(gslot).permute((1, 0)), acc,
                                    use_acc=it > s0, is_async=True)
                acc = warpgroup_mma_wait(num_outstanding=1, deps=[acc])
            acc = warpgroup_mma_wait(num_outstanding=0, deps=[acc])
            _cta_barrier()
            # the tile's last two g slots (the others were freed in the loop)
            if s1 - 2 >= s0:
                mbarrier.arrive(g_empty.index((s1 - 2 - u0) % GSTAGES), count=1)
            mbarrier.arrive(g_empty.index((s1 - 1 - u0) % GSTAGES), count=1)
            rk = (tile // M_BLOCKS) * _TK + 128 * H + rbk
            rmt = (tile % M_BLOCKS) * MP + rm
            ws_tile = gl.expand_dims(rbk, 1) * MP + gl.expand_dims(rm, 0)
            acc = _flush(acc, tile, u0, u1, t_first, PER, N_STEPS, os_ptr, os_ptr, o_ptr, ws_ptr + H * WS_PART,
                         cnt_ptr + H * TILES, rk, rmt, ws_tile, M, K, stride_om, TKW, MP, False, True)

    @gluon.jit
    def _fp4_gemm_t_wgmma(w_desc, s_desc, g_desc, os_ptr, o_ptr, ws_ptr, cnt_ptr,
                          M, K, TOTAL, PER, N_STEPS, M_BLOCKS, stride_om, WS_PART, TILES,
                          BNR: gl.constexpr, MP: gl.constexpr, WSTAGES: gl.constexpr, GSTAGES: gl.constexpr,
                          BF16: gl.constexpr, LOAD_REGS: gl.constexpr, SPLIT: gl.constexpr,
                          CONSUMER_REGS: gl.constexpr):
        adt: gl.constexpr = gl.bfloat16 if BF16 else gl.float16
        NP: gl.constexpr = 2 if SPLIT else 1    # consumer partitions
        TKW: gl.constexpr = _TK // NP          # output columns a partition
        w_bufs = gl.allocate_shared_memory(gl.int32, [WSTAGES, BNR, _TK // 8], w_desc.layout)
        s_bufs = gl.allocate_shared_memory(gl.int16, [WSTAGES, BNR, _TK // 32], s_desc.layout)
        g_bufs = gl.allocate_shared_memory(g_desc.dtype, [GSTAGES, MP, BNR], g_desc.layout)
        a_bufs = gl.allocate_shared_memory(adt, [2 * NP, BNR, TKW],
                                           gl.NVMMASharedLayout.get_default_for([BNR, TKW], adt))
        w_ready = gl.allocate_shared_memory(gl.int64, [WSTAGES, 1], mbarrier.MBarrierLayout())
        w_empty = gl.allocate_shared_memory(gl.int64, [WSTAGES, 1], mbarrier.MBarrierLayout())
        g_ready = gl.allocate_shared_memory(gl.int64, [GSTAGES, 1], mbarrier.MBarrierLayout())
        g_empty = gl.allocate_shared_memory(gl.int64, [GSTAGES, 1], mbarrier.MBarrierLayout())
        for j in gl.static_range(WSTAGES):
            mbarrier.init(w_ready.index(j), count=1)
            mbarrier.init(w_empty.index(j), count=NP)
        for j in gl.static_range(GSTAGES):
            mbarrier.init(g_ready.index(j), count=1)
            mbarrier.init(g_empty.index(j), count=NP)
        if SPLIT:
            gl.warp_specialize([
                (_t_consumer, (w_bufs, s_bufs, g_bufs, a_bufs, w_ready, w_empty, g_ready, g_empty, os_ptr, o_ptr,
                               ws_ptr, cnt_ptr, M, K, TOTAL, PER, N_STEPS, M_BLOCKS, stride_om, WS_PART, TILES,
                               0, 1, BNR, MP, WSTAGES, GSTAGES, BF16)),
                (_t_consumer, (w_bufs, s_bufs, g_bufs, a_bufs, w_ready, w_empty, g_ready, g_empty, os_ptr, o_ptr,
                               ws_ptr, cnt_ptr, M, K, TOTAL, PER, N_STEPS, M_BLOCKS, stride_om, WS_PART, TILES,
                               1, 1, BNR, MP, WSTAGES, GSTAGES, BF16)),
                (_fp4_load, (w_desc, s_desc, w_bufs, s_bufs, w_ready, w_empty, TOTAL, PER, N_STEPS, M_BLOCKS, BNR,
                             WSTAGES, True)),
                (_load_x, (g_desc, g_bufs, g_ready, g_empty, TOTAL, PER, N_STEPS, M_BLOCKS, MP, GSTAGES, BNR)),
            ], [4, 1, 1], [CONSUMER_REGS, LOAD_REGS, LOAD_REGS])
        else:
            gl.warp_specialize([
                (_t_consumer, (w_bufs, s_bufs, g_bufs, a_bufs, w_ready, w_empty, g_ready, g_empty, os_ptr, o_ptr,
                               ws_ptr, cnt_ptr, M, K, TOTAL, PER, N_STEPS, M_BLOCKS, stride_om, WS_PART, TILES,
                               0, 2, BNR, MP, WSTAGES, GSTAGES, BF16)),
                (_fp4_load, (w_desc, s_desc, w_bufs, s_bufs, w_ready, w_empty, TOTAL, PER, N_STEPS, M_BLOCKS, BNR,
                             WSTAGES, True)),
                (_load_x, (g_desc, g_bufs, g_ready, g_empty, TOTAL, PER, N_STEPS, M_BLOCKS, MP, GSTAGES, BNR)),
            ], [1, 1], [LOAD_REGS, LOAD_REGS])


def smem_bytes(bnr: int, mp: int, wstages: int, gstages: int) -> int:
    """Shared memory of one CTA: the weight ring (words + scales of a step), the g ring, the two decode buffers
    [BNR, 256] (2 bytes a weight) and the barriers."""
    return (wstages * bnr * (TILE_K // 2 + TILE_K // 16) + gstages * mp * bnr * 2 + 2 * bnr * TILE_K * 2
            + 16 * (wstages + gstages))


@functools.lru_cache(maxsize=None)
def default_stages(bnr: int, mp: int) -> tuple[int, int]:
    """(WSTAGES, GSTAGES) when the caller names none: as deep as fits, up to 8 weight and 4 g stages, giving up
    weight stages first down to 3, then the fourth g stage, then the third weight stage (BNR = 128: the two decode
    buffers alone are 128 KiB)."""
    wstages, gstages = 8, 4
    while smem_bytes(bnr, mp, wstages, gstages) > SMEM_BUDGET - 2048:
        if wstages > 3:
            wstages -= 1
        elif gstages > 3:
            gstages -= 1
        elif wstages > 2:
            wstages -= 1
        else:
            break
    return wstages, gstages


def default_knobs(m: int) -> dict:
    """bnr, max_mp and split when the caller names none, from the H100 sweeps on the 7B gate and down weights (tune
    --wgmma-t, calls 95 and 97): with two consumer partitions (split: each warpgroup its own barriers; call 96's ncu
    of one 8-warp partition at M = 256: a third of the cycles between two instructions stalled at its barriers)
    and M blocks of 128, 64 weight rows a step, gate / down at M = 256 took 106.5 / 96.6 us against 114.8 / 108.5 in
    one partition and at 512 160.1 / 157.4 against 179.7 / 182.0; at M = 64, 128 rows a step in M blocks of 64
    (43.0 us on down, gate within 2 % of the best). An M block of 128 at M <= 128 (one block) spills in the main
    loop of the split build (offline sm_90), so up to M = 128 the blocks are 64 rows."""
    return dict(bnr=128, max_mp=64, split=True) if m <= 128 else dict(bnr=64, max_mp=128, split=True)


@functools.lru_cache(maxsize=4096)
def wgmma_t_plan(n_pad: int, k_pad: int, m: int, sms: int, bnr: int = 64, max_mp: int = 128) -> dict:
    """Stream-K split of one backward launch (pure arithmetic, testable on CPU): MP = M padded to a power of two in
    16..max_mp, M_BLOCKS = ceil(M / MP), tiles = K_pad / 256 * M_BLOCKS, N_STEPS = N_pad / bnr reduction steps a
    tile, TOTAL = tiles * N_STEPS iterations cut into one contiguous range of PER (>= N_STEPS / MAX_PARTS) per CTA,
    grid <= sms. Returns {MP, M_BLOCKS, tiles, N_STEPS, TOTAL, PER, grid}. Cached (an eager launch's host time):
    the dict is shared, read it only.

    Raises:
        ValueError: K_pad not a multiple of 256, N_pad not a multiple of bnr, or M outside 1..MAX_M.
    """
    if k_pad % TILE_K or n_pad % bnr or not 1 <= m <= MAX_M:
        raise ValueError(f"fp4_gemm_t_wgmma: needs K_pad % {TILE_K} == 0, N_pad % {bnr} == 0 and 1 <= M <= {MAX_M};"
                         f" got K_pad={k_pad}, N_pad={n_pad}, M={m}")
    mp = min(max_mp, max(16, 1 << (m - 1).bit_length()))
    m_blocks = -(-m // mp)
    tiles, n_steps = k_pad // TILE_K * m_blocks, n_pad // bnr
    total = tiles * n_steps
    per, grid = stream_k_split(total, sms, -(-n_steps // MAX_PARTS))
    return dict(MP=mp, M_BLOCKS=m_blocks, tiles=tiles, N_STEPS=n_steps, TOTAL=total, PER=per, grid=grid)


def launch_args(g: torch.Tensor, w: PreparedFP4, o: torch.Tensor, sms: int, *, bnr: int | None = None,
                max_mp: int | None = None, wstages: int | None = None, gstages: int | None = None,
                load_regs: int = 24, split: bool | None = None) -> tuple[int, tuple, dict]:
    """(grid, positional arguments, meta-parameters) of one `_fp4_gemm_t_wgmma` launch computing o = g @ W.

    The one place that turns the knobs into a launch (fp4_gemm_t_wgmma launches it, gluon_compile builds it from
    CPU tensors). Knobs: bnr, weight rows (the reduction) a step, 64 or 128; max_mp, the largest M block (16..128:
    the [256, MP] fp32 accumulator is MP registers a thread); both default to `default_knobs(M)`; wstages /
    gstages, the rings' depths (default `default_stages`); load_regs, each producer warp's registers.

    Raises:
        ValueError: a knob, shape or layout the kernel does not support (the message names it).
    """
    m = g.shape[0]
    default = default_knobs(m)
    bnr, max_mp = bnr or default["bnr"], max_mp or default["max_mp"]
    split = default["split"] if split is None else split
    np_ = 2 if split else 1
    if bnr not in (64, 128) or max_mp not in (16, 32, 64, 128) or load_regs % 8 or not 24 <= load_regs <= 256:
        raise ValueError(f"fp4_gemm_t_wgmma: needs bnr 64 or 128, max_mp a power of two in 16..128 and load_regs a "
                         f"multiple of 8 in 24..256; got bnr={bnr}, max_mp={max_mp}, load_regs={load_regs}")
    n_pad, k_pad = w.words.shape[0], w.words.shape[1] * 8
    plan = wgmma_t_plan(n_pad, k_pad, m, sms, bnr, max_mp)
    mp = plan["MP"]
    dw, dg = default_stages(bnr, mp)
    wstages, gstages = wstages or dw, gstages or dg
    if not 2 <= wstages <= 8 or not 3 <= gstages <= 8 or smem_bytes(bnr, mp, wstages, gstages) > SMEM_BUDGET:
        raise ValueError(f"fp4_gemm_t_wgmma: needs 2..8 weight stages and 3..8 g stages (two steps' g tiles are "
                         f"held) within {SMEM_BUDGET} bytes of shared memory; got wstages={wstages}, "
                         f"gstages={gstages}: {smem_bytes(bnr, mp, wstages, gstages)} bytes at BNR={bnr}, MP={mp}")
    check_tma_rows("fp4_gemm_t_wgmma", "grad_y", "N", g)
    # 2 partial tiles per CTA (per consumer partition: its [256 / np_, MP] share), counters per tile and partition
    ws_part = 2 * plan["grid"] * (TILE_K // np_) * mp
    ws, cnt = _workspace(g.device, np_ * ws_part, np_ * plan["tiles"])
    bf16 = g.dtype == torch.bfloat16
    w_desc, s_desc = weight_descriptors(w, bnr)   # TILE_K == BK: a step's tile is the forward's k-step tile
    g_desc = TensorDescriptor.from_tensor(g, [mp, bnr], smem_layout(mp, bnr, "bfloat16" if bf16 else "float16"))
    # the weight's one factor (a single weight's rows all carry the same), applied to every output column
    args = (w_desc, s_desc, g_desc, w.out_scales[int(bf16)], o, ws, cnt, m, w.k, plan["TOTAL"], plan["PER"],
            plan["N_STEPS"], plan["M_BLOCKS"], o.stride(0), ws_part if split else 0, plan["tiles"])
    # 8 consumer warps + the producers' warpgroup share the SM's registers at launch (168 a thread); setmaxnreg then
    # gives the consumers the producers' share (a split kernel's second consumer partition: CONSUMER_REGS)
    meta = dict(BNR=bnr, MP=mp, WSTAGES=wstages, GSTAGES=gstages, BF16=bf16, LOAD_REGS=load_regs, SPLIT=split,
                CONSUMER_REGS=CONSUMER_REGS, num_warps=NUM_WARPS // np_, maxnreg=_max_regs(NUM_WARPS))
    return plan["grid"], args, meta


def fp4_gemm_t_wgmma(g: torch.Tensor, w: PreparedFP4, **knobs) -> torch.Tensor:
    """grad_x = g @ W for a prepared single NVFP4 weight W [N, K] and g [M, N] fp16/bf16 on a Hopper GPU.

    knobs: see `launch_args` (bnr, max_mp, wstages, gstages, load_regs, split), the one place that holds their
    defaults.

    Raises:
        RuntimeError: Gluon is not available, or the GPU is not a Hopper (sm_90: wgmma).
        ValueError: a group or an MXFP4 weight, or an unsupported shape, dtype, device, layout or knob (the message
            names it).
    """
    if not HAVE_GLUON:
        raise RuntimeError("fp4_gemm_t_wgmma: triton.experimental.gluon (Hopper TMA / mbarrier / wgmma) is not "
                           "available")
    check_grad_operands(g, w)
    index = _device_index(g)
    cap = _capability(index)
    if cap[0] != 9:
        raise RuntimeError(f"fp4_gemm_t_wgmma: wgmma needs a Hopper GPU (sm_90), got sm_{cap[0]}{cap[1]} "
                           f"({torch.cuda.get_device_name(g.device)})")
    o = torch.empty(g.shape[0], w.k, device=g.device, dtype=g.dtype)
    if g.shape[0] == 0:
        return o
    g = _tma_rows(g)
    grid, args, meta = launch_args(g, w, o, _num_sms(index), **knobs)
    launch(_fp4_gemm_t_wgmma, grid, args, meta)
    return o


def check_grad_operands(g: torch.Tensor, w) -> None:
    """A single PreparedFP4 NVFP4 weight (not a group), g CUDA fp16/bf16 [M, w.n] on the weight's device
    (fp4_gluon.check_operands). Raises ValueError naming what is wrong."""
    check_operands("fp4_gemm_t_wgmma", g, w, name="grad_y", cols=getattr(w, "n", None), single=True)
