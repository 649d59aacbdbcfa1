"""The NVFP4 W4A16 GEMM for decode sizes (M <= 64) in Gluon: a persistent, warp-specialized, stream-K kernel.

Why (issue 22): at M = 1..16 the Triton stream-K kernel (fp4_triton._fp4_gemm) reaches ~39 % of the measured read
ceiling (H100, kernels.notes.md calls 1-3; the earlier "~58 %" was of a copy bandwidth measured too low); its loads,
decode and MMA share the same warps, so the memory pipe idles while the warps decode. Here one producer
warp only streams the weight through a STAGES-deep shared-memory ring with TMA (packed E2M1 words and e5m3 block
scales of the load-time layout, layout.py), and the consumer warps only decode and multiply, so loads for later
k-steps are in flight while the current one is decoded.

Shape of the kernel (y[M, N] = x[M, K] @ W[N, K]^T * out_scale (+ bias), computed as y^T = W @ x^T, "swap AB"):
1. Stream-K work split (`gluon_plan`): the (BN-row tile, BK-column k-step) iterations, tile-major, are cut into
   one contiguous range per CTA of a persistent grid of about `num SMs * ctas_per_sm` CTAs, so every CTA streams
   the same weight bytes (+- one k-step) whatever the shape (a split by whole units leaves a tail: 592 tiles of the
   7B gate/up group on 264 CTAs would run 3 rounds for 2.24 rounds of work). Both partitions walk the same range,
   so the ring's slot and phase follow from the iteration index.
2. Producer (1 warp, `_fp4_load`): per k-step (BK = 256 columns) one TMA copy of the [BN, 32] int32 word tile and
   one of the [BN, 8] int16 scale tile, completing on the slot's `ready` barrier; it waits on the slot's `empty`
   barrier before reusing it.
3. Consumers (the default partition, NUM_WARPS warps, `_fp4_mma`): wait `ready`, read the slot into registers,
   release it (`empty`), decode with the same PTX as the Triton kernels (fp4_decoder._asm: E2M1 + both scales in one
   packed multiply) and multiply on the tensor cores with mma.sync (mma_v2, m16n8k16): the decoded weight is the A
   operand [BN, BK] and the activations the B operand [BK, MP] (M padded to MP = 8, 16, 32 or 64).
   Why mma_v2 and not wgmma or CUDA-core FMA: at M <= 16 the product is 2 * M FLOP per 4.5-bit weight, far below
   either unit's limit, so the choice only has to keep the decode the bottleneck-free path: mma.sync takes A from
   registers per warp with no warpgroup-wide synchronisation and an N of 8, so M = 1..8 wastes no MMA work on a
   padded N of 64 (wgmma's smallest useful N for register A is 8 too, but it needs 4 warps to agree and an async
   wait per k-step); CUDA-core FMA would cost 2 * M instructions per weight per thread (M = 16: ~4x the decode's).
4. Tiles cut by a range boundary, deterministic: the CTA parks its fp32 partial tile in a workspace (two slots per
   CTA: its first and last tile), counts arrivals per tile with a gpu-scope acq_rel atomic, and the last CTA to
   arrive sums the parts in CTA order (as the Triton stream-K kernel does), applies the per-row factor (and bias)
   and writes y; tiles a CTA covers whole are written directly. The counters reset themselves.

Numerics: identical to the Triton kernels: decoded weights are exact (w * 2**-62 for bf16, w * 2**-14 for fp16),
products accumulate in fp32, the per-row factor is applied once to the fp32 result.

Limits (checked on the host with a clear error): NVFP4 single or concatenated weights (PreparedFP4, not
MXFP4: MXFP4's uint8 scale rows of a 256-column step are 8 bytes, under TMA's 16-byte minimum),
K_pad a multiple of 256 (every Qwen2.5 shape), M <= 64, fp16/bf16 activations. Not in the default dispatch
(fp4_launch): the benchmark times it as method `nvfp4_gluon` beside cuBLAS and the Triton kernel.

HAVE_GLUON: whether triton.experimental.gluon with the Hopper TMA/mbarrier modules imports (Triton >= 3.5); this
module imports without it (CPU CI), and `fp4_gemm_gluon` then raises.
"""
from __future__ import annotations

import functools

import torch

from qerl_kernels.fp4_decoder import HAVE_TRITON
from qerl_kernels.fp4_launch import _device_index, _num_sms, _workspace  # the Triton kernels' stream-K workspace too
from qerl_kernels.gluon_launch import launch
from qerl_kernels.layout import PreparedFP4

HAVE_GLUON = False
if HAVE_TRITON:
    try:
        from triton.experimental import gluon
        from triton.experimental.gluon import language as gl
        from triton.experimental.gluon.language.nvidia.ampere import mma_v2
        from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma
        from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
        HAVE_GLUON = True
    except ImportError:  # pragma: no cover - older Triton: the module stays importable, the op raises
        HAVE_GLUON = False

__all__ = ["HAVE_GLUON", "BK", "check_operands", "fp4_gemm_gluon", "gluon_plan", "stream_k_split", "launch_args",
           "default_ctas_per_sm", "smem_layout", "weight_descriptors"]

BK = 256          # k columns per pipeline step: the scale tile's rows are then 16 bytes, TMA's minimum
MAX_M = 64

if HAVE_GLUON:
    from qerl_kernels.fp4_decoder import _asm

    _BK = gl.constexpr(BK)
    _ASM_BF16 = gl.constexpr(_asm(0, True))
    _ASM_F16 = gl.constexpr(_asm(0, False))
    # the CTA (partition) barrier: thread_barrier in Triton 3.5-3.6, barrier later
    _cta_barrier = gl.thread_barrier if hasattr(gl, "thread_barrier") else gl.barrier
    # the TMA tile load: async_copy_global_to_shared in Triton 3.5-3.6, async_load later (same arguments)
    _tma_load = tma.async_load if hasattr(tma, "async_load") else tma.async_copy_global_to_shared

    @gluon.jit
    def _ring(i, STAGES: gl.constexpr):
        """(slot, phase) of the i-th use of a STAGES-deep ring: the one place for the phase arithmetic (this kernel's
        and fp4_wgmma's)."""
        return i % STAGES, (i // STAGES) & 1

    @gluon.jit
    def _fp4_load(w_desc, s_desc, w_bufs, s_bufs, ready, empty, TOTAL, PER, K_STEPS, M_BLOCKS,
                  BN: gl.constexpr, STAGES: gl.constexpr, TRANSPOSED: gl.constexpr = False):
        """Producer warp: TMA copies of the word and scale tiles of this CTA's (tile, k-step) iterations (this
        kernel's, M_BLOCKS a constexpr 1, and fp4_wgmma's, whose tiles are (weight tile, M block) pairs). TRANSPOSED
        (fp4_wgmma_t, the backward): a tile is BK output columns of W and a step BN of its rows, so the k-step picks
        the rows and the tile the columns."""
        u0 = gl.program_id(0) * PER
        u1 = gl.minimum(u0 + PER, TOTAL)
        nbytes: gl.constexpr = w_desc.block_type.nbytes + s_desc.block_type.nbytes
        for it in range(u0, u1):
            tile = it // K_STEPS
            ks = it - tile * K_STEPS
            if TRANSPOSED:
                row = ks * BN
                col = tile // M_BLOCKS
            else:
                row = (tile // M_BLOCKS) * BN
                col = ks
            slot, phase = _ring(it - u0, STAGES)
            mbarrier.wait(empty.index(slot), phase ^ 1)   # barriers start with phase 1 complete
            mbarrier.expect(ready.index(slot), nbytes)
            _tma_load(w_desc, [row, col * (_BK // 8)], ready.index(slot), w_bufs.index(slot))
            _tma_load(s_desc, [row, col * (_BK // 32)], ready.index(slot), s_bufs.index(slot))

    @gluon.constexpr_function
    def _scale_layout(BN, NUM_WARPS, CHUNKS=2):
        """Register layout of the [BN, 4 * CHUNKS] scale tile (CHUNKS 128-column chunks: 2 = one k-step here, 1 in
        the wgmma kernel) such that, reshaped to [n, chunk, b], it is the words' layout (w_l reshaped to [n, chunk,
        c, b]) with the lane-quad dimension c sliced off: a thread loads the 4 scales of each chunk of each of its
        rows (16-byte shared loads at 2 chunks, the 4 lanes of a quad the same ones), and the decode broadcasts
        them over c without moving data (a plain convert_layout went through shared memory: stmatrix, ldmatrix and
        two extra barriers per k-step)."""
        BN, NUM_WARPS, CHUNKS = int(BN), int(NUM_WARPS), int(CHUNKS)
        warps = [[16 << i, 0] for i in range(NUM_WARPS.bit_length() - 1)]
        reps = [[(16 * NUM_WARPS) << j, 0] for j in range((BN // (16 * NUM_WARPS)).bit_length() - 1)]
        chunks = [[0, 4 << j] for j in range(CHUNKS.bit_length() - 1)]
        return gl.DistributedLinearLayout(reg_bases=[[0, 1], [0, 2], [8, 0]] + chunks + reps,
                                          lane_bases=[[0, 0], [0, 0], [1, 0], [2, 0], [4, 0]], warp_bases=warps,
                                          block_bases=[], shape=[BN, 4 * CHUNKS])

    @gluon.jit
    def _decode(w2, s2, BN: gl.constexpr, BF16: gl.constexpr, NB: gl.constexpr = 4):
        """[BN, 4 * NB * NC] words + [BN, NB * NC] scales -> [BN, 32 * NB * NC] decoded weights (see
        fp4_decoder._decode_tile): NC groups of NB 32-column words per lane quad, word index (chunk, c, b). Here NB
        = 4, NC = 2 (one k-step of two whole 128-column chunks); the wgmma kernel (fp4_wgmma) decodes one chunk (NC
        = 1) or half of one (NB = 2: words b = 0, 1 or 2, 3 of each quad lane, columns 64 apart)."""
        NC: gl.constexpr = w2.shape[1] // (4 * NB)
        w4 = gl.reshape(w2, [BN, NC, 4, NB])                                              # [n, chunk, c, b]
        s3 = gl.convert_layout(gl.reshape(s2, [BN, NC, NB]), gl.SliceLayout(2, w4.type.layout),  # [n, chunk, b]
                               assert_trivial=True)
        s4 = gl.expand_dims(s3, 2)                                                        # [n, chunk, 1, b]
        w4, s4 = gl.broadcast(w4, s4)
        if BF16:
            o0, o1, o2, o3, o4, o5, o6, o7 = gl.inline_asm_elementwise(
                _ASM_BF16, "=h,=h,=h,=h,=h,=h,=h,=h,r,h", [w4, s4], dtype=(gl.bfloat16,) * 8, is_pure=True, pack=1)
        else:
            o0, o1, o2, o3, o4, o5, o6, o7 = gl.inline_asm_elementwise(
                _ASM_F16, "=h,=h,=h,=h,=h,=h,=h,=h,r,h", [w4, s4], dtype=(gl.float16,) * 8, is_pure=True, pack=1)
        w = gl.join(gl.join(gl.join(o0, o1), gl.join(o2, o3)), gl.join(gl.join(o4, o5), gl.join(o6, o7)))
        # dims [n, chunk, c, b, r, q0, q1] -> [n, chunk, b, q1, q0, c, r]: column 32b + 8q + 2c + r
        w = gl.permute(w, (0, 1, 3, 6, 5, 2, 4))
        return gl.reshape(w, [BN, NC * NB * 32])

    @gluon.jit
    def _store_tile(acc, os_ptr, bias_ptr, y_ptr, rn, rm, M, N, stride_ym, HAS_BIAS: gl.constexpr,
                    ONE_SCALE: gl.constexpr = False):
        if ONE_SCALE:   # one factor for every output row (fp4_wgmma_t: a single weight's, along its K)
            out = acc * gl.load(os_ptr)
        else:
            out = acc * gl.expand_dims(gl.load(os_ptr + rn, mask=rn < N, other=0.0), 1)
        if HAS_BIAS:
            out += gl.expand_dims(gl.load(bias_ptr + rn, mask=rn < N, other=0.0).to(gl.float32), 1)
        mask = gl.expand_dims(rn < N, 1) & gl.expand_dims(rm < M, 0)
        ptrs = y_ptr + gl.expand_dims(rm, 0) * stride_ym + gl.expand_dims(rn, 1)
        gl.store(ptrs, out.to(y_ptr.dtype.element_ty), mask=mask)

    @gluon.jit
    def _flush(acc, tile, u0, u1, t_first, PER, K_STEPS, os_ptr, bias_ptr, y_ptr, ws_ptr, cnt_ptr, rn, rm, ws_tile,
               M, N, stride_ym, BN: gl.constexpr, MP: gl.constexpr, HAS_BIAS: gl.constexpr,
               ONE_SCALE: gl.constexpr = False):
        """A tile's accumulator at the end of its k-steps in this CTA: written out if this CTA did all of them,
        else parked as a partial (slot 0: the CTA's first tile, 1: its last) and, by the last CTA to arrive,
        summed in CTA order (deterministic), scaled and written; the tile's counter is then reset. `tile` is the
        tile's index in the stream-K iteration space, rn / rm its output rows of W and of x (the wgmma kernel's
        tiles also have an M index: its rm are the M block's rows of x, masked against the whole M). Returns the
        tile's registers for the caller to carry on (the sum of the parts where this CTA reduced them: it is summed
        in the accumulator's own registers, parked first, so a [BN, MP] fp32 tile is never held twice: at MP = 256
        that is 128 registers a thread). ONE_SCALE: os_ptr holds one factor for every row (else one a row)."""
        if (tile * K_STEPS >= u0) & ((tile + 1) * K_STEPS <= u1):
            _store_tile(acc, os_ptr, bias_ptr, y_ptr, rn, rm, M, N, stride_ym, HAS_BIAS, ONE_SCALE)
        else:
            slot = gl.program_id(0) * 2 + (tile != t_first).to(gl.int32)
            gl.store(ws_ptr + slot * (BN * MP) + ws_tile, acc)
            _cta_barrier()
            arrived = gl.atomic_add(cnt_ptr + tile, 1, sem="acq_rel", scope="gpu")
            first_cta = (tile * K_STEPS) // PER
            last_cta = ((tile + 1) * K_STEPS - 1) // PER
            if arrived == last_cta - first_cta:
                f_slot = first_cta * 2 + (tile != (first_cta * PER) // K_STEPS).to(gl.int32)
                acc = gl.load(ws_ptr + f_slot * (BN * MP) + ws_tile, cache_modifier=".cg")
                for p in range(first_cta + 1, last_cta + 1):
                    p_slot = p * 2 + (tile != (p * PER) // K_STEPS).to(gl.int32)
                    acc += gl.load(ws_ptr + p_slot * (BN * MP) + ws_tile, cache_modifier=".cg")
                _store_tile(acc, os_ptr, bias_ptr, y_ptr, rn, rm, M, N, stride_ym, HAS_BIAS, ONE_SCALE)
                gl.atomic_xchg(cnt_ptr + tile, 0)
        return acc

    @gluon.jit
    def _fp4_mma(x_ptr, os_ptr, bias_ptr, y_ptr, ws_ptr, cnt_ptr, w_bufs, s_bufs, ready, empty,
                 M, N, K, TOTAL, PER, K_STEPS, stride_xm, stride_ym,
                 BN: gl.constexpr, MP: gl.constexpr, STAGES: gl.constexpr, BF16: gl.constexpr,
                 HAS_BIAS: gl.constexpr, NUM_WARPS: gl.constexpr):
        """Consumer warps: decode each ring slot and accumulate W_tile @ x^T with mma.sync; flush at tile ends."""
        mma: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[NUM_WARPS, 1],
                                                      instr_shape=[16, 8])
        a_l: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=2)
        b_l: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=mma, k_width=2)
        # words [BN, 32] int32 as an 8-bit-style A operand (k_width 4): a thread holds words 4c..4c+3 of both
        # 16-word chunks for rows g and g + 8 (lane 4g + c), so after the decode its bf16 pairs sit where the
        # k_width-2 A fragment wants them (the conversion to a_l then stays in registers)
        w_l: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=4)
        s_l: gl.constexpr = _scale_layout(BN, NUM_WARPS)
        u0 = gl.program_id(0) * PER
        u1 = gl.minimum(u0 + PER, TOTAL)
        t_first = u0 // K_STEPS
        rk = gl.arange(0, _BK, layout=gl.SliceLayout(1, b_l))  # x^T tile [BK, MP] loaded as the B operand
        rmx = gl.arange(0, MP, layout=gl.SliceLayout(0, b_l))
        m_ok = gl.expand_dims(rmx < M, 0)
        x_cols = x_ptr + gl.expand_dims(rmx, 0) * stride_xm
        rbn = gl.arange(0, BN, layout=gl.SliceLayout(1, mma))
        rm = gl.arange(0, MP, layout=gl.SliceLayout(0, mma))
        ws_tile = gl.expand_dims(rbn, 1) * MP + gl.expand_dims(rm, 0)
        acc = gl.zeros([BN, MP], gl.float32, mma)
        for it in range(u0, u1):
            tile = it // K_STEPS
            ks = it - tile * K_STEPS
            k0 = ks * _BK
            xt = gl.load(x_cols + gl.expand_dims(k0 + rk, 1), mask=m_ok & gl.expand_dims(k0 + rk < K, 1), other=0.0)
            slot, phase = _ring(it - u0, STAGES)
            mbarrier.wait(ready.index(slot), phase)
            w2 = w_bufs.index(slot).load(w_l)
            s2 = s_bufs.index(slot).load(s_l)
            fence_async_shared()            # order the shared reads before the producer's next TMA write
            mbarrier.arrive(empty.index(slot), count=1)
            a = gl.convert_layout(_decode(w2, s2, BN, BF16), a_l, assert_trivial=True)
            acc = mma_v2(a, xt, acc)
            if (ks == K_STEPS - 1) | (it == u1 - 1):
                _flush(acc, tile, u0, u1, t_first, PER, K_STEPS, os_ptr, bias_ptr, y_ptr, ws_ptr, cnt_ptr,
                       tile * BN + rbn, rm, ws_tile, M, N, stride_ym, BN, MP, HAS_BIAS)
                acc = gl.zeros([BN, MP], gl.float32, mma)

    @gluon.jit
    def _fp4_gemm_ws(w_desc, s_desc, x_ptr, os_ptr, bias_ptr, y_ptr, ws_ptr, cnt_ptr,
                     M, N, K, TOTAL, PER, K_STEPS, stride_xm, stride_ym,
                     BN: gl.constexpr, MP: gl.constexpr, STAGES: gl.constexpr, BF16: gl.constexpr,
                     HAS_BIAS: gl.constexpr, NUM_WARPS: gl.constexpr, LOAD_REGS: gl.constexpr):
        w_bufs = gl.allocate_shared_memory(gl.int32, [STAGES, BN, _BK // 8], w_desc.layout)
        s_bufs = gl.allocate_shared_memory(gl.int16, [STAGES, BN, _BK // 32], s_desc.layout)
        ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        for j in gl.static_range(STAGES):
            mbarrier.init(ready.index(j), count=1)
            mbarrier.init(empty.index(j), count=1)
        ONE_M_BLOCK: gl.constexpr = 1   # M <= 64: one block of M, so a tile is a weight tile
        gl.warp_specialize([
            (_fp4_mma, (x_ptr, os_ptr, bias_ptr, y_ptr, ws_ptr, cnt_ptr, w_bufs, s_bufs, ready, empty,
                        M, N, K, TOTAL, PER, K_STEPS, stride_xm, stride_ym,
                        BN, MP, STAGES, BF16, HAS_BIAS, NUM_WARPS)),
            (_fp4_load, (w_desc, s_desc, w_bufs, s_bufs, ready, empty, TOTAL, PER, K_STEPS, ONE_M_BLOCK, BN,
                         STAGES)),
        ], [1], [LOAD_REGS])


def gluon_plan(n_pad: int, k_pad: int, m: int, sms: int, bn: int = 64, ctas_per_sm: int = 2) -> dict:
    """Stream-K split of one launch (pure arithmetic, testable on CPU).

    The (tile, k-step) iterations, tile-major, are cut into `grid` contiguous ranges of PER (the last may be
    shorter), grid = about sms * ctas_per_sm and every CTA non-empty, so every CTA streams the same number of
    weight bytes (+- one k-step) whatever the shape. Returns {MP, tiles, K_STEPS, TOTAL, PER, grid}.

    Raises:
        ValueError: K_pad not a multiple of BK, N_pad not a multiple of bn, or M outside 1..MAX_M.
    """
    if k_pad % BK or n_pad % bn or not 1 <= m <= MAX_M:
        raise ValueError(f"fp4_gemm_gluon: needs K_pad % {BK} == 0, N_pad % {bn} == 0 and 1 <= M <= {MAX_M}; got "
                         f"K_pad={k_pad}, N_pad={n_pad}, M={m}")
    mp = max(8, 1 << (m - 1).bit_length())
    tiles, k_steps = n_pad // bn, k_pad // BK
    total = tiles * k_steps
    per, grid = stream_k_split(total, sms * ctas_per_sm)
    return dict(MP=mp, tiles=tiles, K_STEPS=k_steps, TOTAL=total, PER=per, grid=grid)


def stream_k_split(total: int, ctas: int, min_per: int = 1) -> tuple[int, int]:
    """(PER, grid): `total` iterations cut into contiguous ranges of PER (at least `min_per`) for at most `ctas`
    CTAs, none empty (the last may be shorter). Shared by the Gluon kernels (this one and fp4_wgmma)."""
    per = max(min_per, -(-total // min(total, ctas)))
    return per, -(-total // per)


def _max_regs(num_warps: int, ctas_per_sm: int) -> int:
    """Registers per thread so that ctas_per_sm CTAs fit an SM's 64 Ki registers: each CTA holds its consumer warps
    plus one warpgroup (4 warps) for the producer; a multiple of 8, at most 232."""
    return min(232, 65536 // (ctas_per_sm * (num_warps + 4) * 32) // 8 * 8)


def default_ctas_per_sm(m: int) -> int:
    """Persistent CTAs per SM when the caller names none: 2 at M <= 16, else 1 with a larger register budget (at
    M = 32-64 the x^T operand alone is 64 registers per thread)."""
    return 2 if m <= 16 else 1


def launch_args(x: torch.Tensor, w: PreparedFP4, bias: torch.Tensor | None, y: torch.Tensor, sms: int, *,
                bn: int = 64, stages: int = 4, ctas_per_sm: int | None = None, num_warps: int = 4,
                load_regs: int = 40) -> tuple[int, tuple, dict]:
    """(grid, positional arguments, meta-parameters) of one `_fp4_gemm_ws` launch computing y = x @ W^T (+ bias).

    The one place that turns the knobs into a launch: fp4_gemm_gluon launches what it returns, and the offline
    compile check (gluon_compile.py) compiles it from CPU tensors of the same shapes and dtypes, so the check builds
    exactly the binaries a launch would (same signature, constexprs and alignment specialisations). The stream-K
    partials and counters are the per-device workspace of the Triton kernels (fp4_launch._workspace), grown to fit.

    Raises:
        ValueError: a knob or shape the kernel does not support (the message names it).
    """
    m = x.shape[0]
    if (num_warps not in (4, 8) or bn & (bn - 1) or bn % (16 * num_warps) or not 1 <= stages <= 8 or load_regs % 8
            or not 24 <= load_regs <= 256):
        raise ValueError(f"fp4_gemm_gluon: needs num_warps 4 or 8 (whole warpgroups), bn a power of two and a multiple "
                         f"of 16 * num_warps, 1 <= stages <= 8 and load_regs a multiple of 8 in 24..256; got bn={bn}, "
                         f"num_warps={num_warps}, stages={stages}, load_regs={load_regs}")
    n_pad, k_pad = w.words.shape[0], w.words.shape[1] * 8
    if ctas_per_sm is None:
        ctas_per_sm = default_ctas_per_sm(m)
    plan = gluon_plan(n_pad, k_pad, m, sms, bn, ctas_per_sm)
    ws, cnt = _workspace(x.device, 2 * plan["grid"] * bn * plan["MP"], plan["tiles"])  # 2 partial tiles per CTA
    # TMA tiles of one k-step: [bn, 32] int32 words (128 bytes a row) and [bn, 8] int16 scales (16 bytes a row, TMA's
    # minimum); both row strides (K_pad / 2 and K_pad / 16 bytes) are multiples of 16 bytes since K_pad % 256 == 0
    w_desc, s_desc = weight_descriptors(w, bn)
    bf16 = x.dtype == torch.bfloat16
    os_row = w.out_scales[int(bf16)]
    args = (w_desc, s_desc, x, os_row, bias if bias is not None else os_row, y, ws, cnt,
            m, w.n, w.k, plan["TOTAL"], plan["PER"], plan["K_STEPS"], x.stride(0), y.stride(0))
    meta = dict(BN=bn, MP=plan["MP"], STAGES=stages, BF16=bf16, HAS_BIAS=bias is not None, NUM_WARPS=num_warps,
                LOAD_REGS=load_regs, num_warps=num_warps, maxnreg=_max_regs(num_warps, ctas_per_sm))
    return plan["grid"], args, meta


@functools.lru_cache(maxsize=None)
def smem_layout(rows: int, cols: int, dtype: str):
    """A TMA tile's shared-memory layout (NVMMASharedLayout.get_default_for) for `dtype` (a gl attribute name), built
    once per shape and dtype: ~9 us of Python each, three a launch, on an eager launch's host path (call 99)."""
    return gl.NVMMASharedLayout.get_default_for([rows, cols], getattr(gl, dtype))


def weight_descriptors(w: PreparedFP4, rows: int) -> tuple:
    """The TMA descriptors of one k-step of `rows` weight rows, as the three Gluon kernels' weight producer
    (`_fp4_load`) reads them: words [rows, BK / 8] int32 (128-byte rows) and scales [rows, BK / 32] int16 (16-byte
    rows, TMA's minimum); both row strides (K_pad / 2 and K_pad / 16 bytes) are multiples of 16 bytes since K_pad is
    a multiple of BK. Built once per weight, tile height and storage (kept on the weight: two descriptors were ~30
    us of an eager launch's host time on the H100 machine, call 102), so they live as long as the weight does."""
    words, scales = w.words, w.scales   # the key: what a descriptor encodes (a view at the same address differs)
    key = (rows, words.data_ptr(), tuple(words.shape), words.stride(0), scales.data_ptr(), tuple(scales.shape),
           scales.stride(0))
    cache = w.__dict__.setdefault("_tma_descriptors", {})
    descs = cache.get(key)
    if descs is None:
        descs = cache[key] = (
            TensorDescriptor.from_tensor(w.words, [rows, BK // 8], smem_layout(rows, BK // 8, "int32")),
            TensorDescriptor.from_tensor(w.scales, [rows, BK // 32], smem_layout(rows, BK // 32, "int16")))
    return descs


def check_operands(kernel: str, x: torch.Tensor, w, bias: torch.Tensor | None = None, *, name: str = "x",
                   cols: int | None = None, single: bool = False) -> None:
    """The operands the Gluon kernels take: a PreparedFP4 NVFP4 weight (`single`: not a group, fp4_wgmma_t's), `name`
    (x, or the backward's grad_y) CUDA fp16/bf16 [M, cols] (default w.k) on the weight's device (the TMA descriptors
    would address another device's memory: a fault), bias [N] on its device. Raises ValueError naming `kernel` and
    what is wrong."""
    if not isinstance(w, PreparedFP4) or w.scale_kind != 0 or (single and w.row_scale):
        raise ValueError(f"{kernel}: expects a {'single ' if single else ''}PreparedFP4 NVFP4 weight"
                         f"{' (not a group)' if single else ''}, got {type(w).__name__} "
                         f"scale_kind={getattr(w, 'scale_kind', None)} parts={len(getattr(w, 'parts', ()))}")
    cols = w.k if cols is None else cols
    if w.words.device != x.device:
        raise ValueError(f"{kernel}: {name} must be on the weight's device {w.words.device}, got {x.device}")
    if x.dim() != 2 or x.shape[1] != cols or x.dtype not in (torch.float16, torch.bfloat16) or not x.is_cuda:
        raise ValueError(f"{kernel}: {name} must be CUDA fp16/bf16 [M, {cols}], got {x.dtype} {tuple(x.shape)} "
                         f"on {x.device}")
    if bias is not None and (tuple(bias.shape) != (w.n,) or bias.device != x.device):
        raise ValueError(f"{kernel}: bias must be [{w.n}] on {x.device}, got {tuple(bias.shape)} on "
                         f"{bias.device}")


def fp4_gemm_gluon(x: torch.Tensor, w: PreparedFP4, bias: torch.Tensor | None = None, **knobs) -> torch.Tensor:
    """y = x @ W^T (+ bias) for a prepared NVFP4 weight and x [M, K] fp16/bf16 on a Hopper GPU, M <= 64.

    knobs (defaults in `launch_args`, the one place that holds them, so the offline compile check builds what this
    launches): bn, weight rows per tile (a power of two, a multiple of 16 * num_warps); stages, ring depth;
    ctas_per_sm, persistent CTAs per SM (default `default_ctas_per_sm`); num_warps, consumer warps (4 or 8);
    load_regs, the producer warp's registers.

    Raises:
        RuntimeError: Gluon is not available (Triton without triton.experimental.gluon's Hopper modules).
        ValueError: unsupported weight (MXFP4), shape, dtype or knob (the message names it).
    """
    if not HAVE_GLUON:
        raise RuntimeError("fp4_gemm_gluon: triton.experimental.gluon (Hopper TMA / mbarrier) is not available")
    check_operands("fp4_gemm_gluon", x, w, bias)
    x = x.contiguous()
    bias = bias.contiguous() if bias is not None else None
    y = torch.empty(x.shape[0], w.n, device=x.device, dtype=x.dtype)
    index = _device_index(x)
    grid, args, meta = launch_args(x, w, bias, y, _num_sms(index), **knobs)
    launch(_fp4_gemm_ws, grid, args, meta)
    return y
