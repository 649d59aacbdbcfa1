"""The Triton kernels of the FP4 (NVFP4 / MXFP4) W4A16 family: the fused dequantize-GEMM (swap-AB, stream-K), the
standalone dequantize, the transposed GEMM of the backward and the tensor-core tiles. They read the load-time layout
of layout.py through the decoder of fp4_decoder.py; fp4_launch.py launches them (autotuned
by fp4_tuning.py).

Why this shape (the kernels issue): 4-bit weights pay only if the matmul streams 4.5 bits per weight at close to HBM
bandwidth. A plain "decode E2M1 with a bit trick, then tl.dot" Triton kernel stalls on decode and data movement far
below that (0.3-0.9 TB/s measured). What these kernels do instead, Marlin-style (with the layout and the decoder):

1. "Swap AB" (`_fp4_gemm`): the kernel computes y^T = W @ x^T, so the decoded weight tile is wgmma's A operand
   straight from registers (never written to shared memory) and the activations, tiny at decode, are the B operand
   (M padded to 16).
2. Decode shapes (M <= 64) use stream-K: a persistent grid of about 2 CTAs per SM splits (tile, k-step) work
   evenly; tiles shared by several CTAs are reduced deterministically by the last CTA to finish (fp32 partials
   in a workspace, an arrival counter that resets itself), so one launch does the whole product. Larger M uses the
   same kernel with one tile per CTA.
3. The epilogue (`_epilogue`) can add a LoRA update t @ B^T (one small MMA per tile) and the residual stream, so
   o_proj / down_proj of a decode step are one launch each (`prepared_ops.fp4_linear_fused`).
4. `_fp4_dequant`: the dense weight (for dequantize + cuBLAS, which wins at large M).
5. The backward input gradient grad_x = grad_y @ W (`_fp4_gemm_t`) decodes the same tiles in a transposed kernel,
   split over W's rows with a deterministic last-arrival reduction.
6. Tensor-core tiles in the natural orientation (`_fp4_gemm_tc`: the decoded tile staged through shared memory as
   wgmma's B operand), forward and backward.

Numerics: products accumulate in fp32 (wgmma); fp16 activations run the fp16 MMA, bf16 activations the bf16 MMA.
"""
from __future__ import annotations

from qerl_kernels.fp4_decoder import HAVE_TRITON

if HAVE_TRITON:
    import triton
    import triton.language as tl

    from qerl_kernels.fp4_decoder import _decode_tile

    @triton.jit
    def _epilogue(acc, os_ptr, bias_ptr, y_ptr, rn, rm, M, N, stride_ym, t_ptr, lb_ptr, res_ptr, stride_t, stride_res,
                  HAS_BIAS: tl.constexpr, HAS_LORA: tl.constexpr, R: tl.constexpr, HAS_RES: tl.constexpr,
                  IEEE: tl.constexpr):
        # os_ptr: this MMA dtype's row of the per-row factors
        out = acc * tl.load(os_ptr + rn, mask=rn < N, other=0.0)[:, None]   # [BN, BM] fp32
        if HAS_BIAS:
            out += tl.load(bias_ptr + rn, mask=rn < N, other=0.0).to(tl.float32)[:, None]
        mask = (rn < N)[:, None] & (rm < M)[None, :]
        if HAS_LORA:  # + (t @ B^T)^T: B [N, R] (scaled), t [M, R], one small MMA per tile
            rr = tl.arange(0, R)
            bt = tl.load(lb_ptr + rn[:, None] * R + rr[None, :], mask=(rn < N)[:, None], other=0.0)   # [BN, R]
            tt = tl.load(t_ptr + rm[None, :] * stride_t + rr[:, None], mask=(rm < M)[None, :], other=0.0)  # [R, BM]
            if IEEE:
                out += tl.dot(bt.to(tl.float32), tt.to(tl.float32), input_precision="ieee")
            else:
                out += tl.dot(bt, tt)
        if HAS_RES:  # + the residual stream: the output is the new hidden state
            out += tl.load(res_ptr + rm[None, :] * stride_res + rn[:, None], mask=mask, other=0.0).to(tl.float32)
        tl.store(y_ptr + rm[None, :] * stride_ym + rn[:, None], out.to(y_ptr.dtype.element_ty), mask=mask)

    @triton.jit(do_not_specialize=["M", "M_BUCKET"])
    def _fp4_gemm(
            # pointers
            x_ptr, w_ptr, s_ptr, out_scale_ptr, bias_ptr, y_ptr, ws_ptr, cnt_ptr, t_ptr, lb_ptr, res_ptr,
            # sizes (KW: padded K, a multiple of BK; M_BUCKET only keys the autotuner)
            M, N, K, KW, M_BUCKET,
            # strides (elements)
            stride_xm, stride_wn, stride_sn, stride_ym, stride_os, stride_t, stride_res,
            # meta
            SCALE_KIND: tl.constexpr, BF16: tl.constexpr, HAS_BIAS: tl.constexpr, USE_ASM: tl.constexpr,
            STREAM_K: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr,
            CPS: tl.constexpr, EVEN_K: tl.constexpr, HAS_LORA: tl.constexpr,
            R: tl.constexpr, HAS_RES: tl.constexpr):
        """y[M, N] = x[M, K] @ W[N, K]^T * out_scale (+ bias) (+ t @ B^T) (+ residual), computed as y^T tiles
        [BN, BM] = W_tile @ x^T."""
        pid = tl.program_id(0)
        tiles_m = tl.cdiv(M, BM)
        tiles_n = tl.cdiv(N, BN)
        k_steps = KW // BK
        total = tiles_m * tiles_n * k_steps
        if STREAM_K:
            per = tl.cdiv(total, tl.num_programs(0))
        else:
            per = k_steps
        u0 = pid * per
        u1 = tl.minimum(u0 + per, total)
        t_first = u0 // k_steps
        t_last = (u1 - 1) // k_steps
        out_scale = out_scale_ptr + BF16 * stride_os
        rbn = tl.arange(0, BN)
        rbm = tl.arange(0, BM)
        rw = tl.arange(0, BK // 8)
        rs = tl.arange(0, BK // 32)
        rk = tl.arange(0, BK)
        RED: tl.constexpr = max(1, 4096 // (BN * BM))  # partial tiles per reduction load (<= 32 fp32 regs)
        for t in range(t_first, t_last + 1):
            ks0 = tl.maximum(u0 - t * k_steps, 0)
            ks1 = tl.minimum(u1 - t * k_steps, k_steps)
            # grouped tile order: GROUP_M m-tiles share each W tile while it is in L2
            in_group = GROUP_M * tiles_n
            first_m = (t // in_group) * GROUP_M
            group_m = tl.minimum(tiles_m - first_m, GROUP_M)
            pid_m = first_m + (t % in_group) % group_m
            pid_n = (t % in_group) // group_m
            rn = pid_n * BN + rbn
            rm = pid_m * BM + rbm
            w_ptrs = w_ptr + rn[:, None] * stride_wn + rw[None, :]
            s_ptrs = s_ptr + rn[:, None] * stride_sn + rs[None, :]
            x_ptrs = x_ptr + rm[None, :] * stride_xm + rk[:, None]
            m_ok = rm[None, :] < M
            acc = tl.zeros([BN, BM], dtype=tl.float32)
            for ks in range(ks0, ks1):
                k0 = ks * BK
                wq = tl.load(w_ptrs + k0 // 8)
                sc = tl.load(s_ptrs + k0 // 32)
                if EVEN_K:  # K % BK == 0: only the (loop-invariant) row mask
                    xt = tl.load(x_ptrs + k0, mask=m_ok, other=0.0)
                else:
                    xt = tl.load(x_ptrs + k0, mask=m_ok & (rk[:, None] < K - k0), other=0.0)
                w = _decode_tile(wq, sc, BN, BK, SCALE_KIND, BF16, USE_ASM)
                if USE_ASM:
                    acc = tl.dot(w, xt, acc)
                else:  # reference path (interpreter: no bf16 matmul); exact operands, fp32 products
                    acc = tl.dot(w.to(tl.float32), xt.to(tl.float32), acc, input_precision="ieee")
            if (ks0 == 0) & (ks1 == k_steps):
                _epilogue(acc, out_scale, bias_ptr, y_ptr, rn, rm, M, N, stride_ym, t_ptr, lb_ptr, res_ptr, stride_t,
                          stride_res, HAS_BIAS, HAS_LORA, R, HAS_RES, not USE_ASM)
            else:
                # Stream-K partial tile: park it, count arrivals; the last arrival sums all parts in CTA order.
                slot = pid * 2 + (t != t_first).to(tl.int32)
                ws_tile = rbn[:, None] * BM + rbm[None, :]
                tl.store(ws_ptr + slot * (BN * BM) + ws_tile, acc, mask=m_ok)
                # CTA barrier, then one thread's gpu-scope acq_rel arrival (release is cumulative over the CTA's
                # stores, as in CUTLASS's semaphore); the winner's threads read after the broadcast barrier.
                tl.debug_barrier()
                arrived = tl.atomic_add(cnt_ptr + t, 1, sem="acq_rel", scope="gpu")
                first_cta = (t * k_steps) // per
                last_cta = ((t + 1) * k_steps - 1) // per
                if arrived == last_cta - first_cta:
                    tot = tl.zeros([BN, BM], dtype=tl.float32)
                    # RED parts per load, so the reduction costs one L2 latency per RED parts, not per part
                    for p0 in range(first_cta, last_cta + 1, RED):
                        rp = p0 + tl.arange(0, RED)
                        p_slot = rp * 2 + (t != (rp * per) // k_steps).to(tl.int32)
                        part = tl.load(ws_ptr + p_slot[:, None, None] * (BN * BM) + ws_tile[None, :, :],
                                       mask=(rp <= last_cta)[:, None, None] & m_ok[None, :, :], other=0.0,
                                       cache_modifier=".cg")
                        tot += tl.sum(part, axis=0)
                    _epilogue(tot, out_scale, bias_ptr, y_ptr, rn, rm, M, N, stride_ym, t_ptr, lb_ptr, res_ptr,
                              stride_t, stride_res, HAS_BIAS, HAS_LORA, R, HAS_RES, not USE_ASM)
                    tl.atomic_xchg(cnt_ptr + t, 0)

    @triton.jit
    def _fp4_dequant(
            # pointers
            w_ptr, s_ptr, out_scale_ptr, o_ptr,
            # sizes
            N, K,
            # strides
            stride_wn, stride_sn, stride_on, stride_os,
            # meta
            SCALE_KIND: tl.constexpr, BF16: tl.constexpr, USE_ASM: tl.constexpr, BN: tl.constexpr,
            BK: tl.constexpr):
        """W[N, K] (fp16/bf16, natural layout) from the prepared weight."""
        pid_n = tl.program_id(0)
        pid_k = tl.program_id(1)
        rn = pid_n * BN + tl.arange(0, BN)
        wq = tl.load(w_ptr + rn[:, None] * stride_wn + pid_k * (BK // 8) + tl.arange(0, BK // 8)[None, :])
        sc = tl.load(s_ptr + rn[:, None] * stride_sn + pid_k * (BK // 32) + tl.arange(0, BK // 32)[None, :])
        w = _decode_tile(wq, sc, BN, BK, SCALE_KIND, BF16, USE_ASM)
        w = (w.to(tl.float32) * tl.load(out_scale_ptr + BF16 * stride_os + rn)[:, None]).to(o_ptr.dtype.element_ty)
        rk = pid_k * BK + tl.arange(0, BK)
        tl.store(o_ptr + rn[:, None] * stride_on + rk[None, :], w, mask=(rn < N)[:, None] & (rk < K)[None, :])

    @triton.jit(do_not_specialize=["M"])
    def _fp4_gemm_t(
            # pointers
            g_ptr, w_ptr, s_ptr, out_scale_ptr, o_ptr, ws_ptr, cnt_ptr,
            # sizes: g [M, N] (N = weight rows), o [M, K]; NP: padded rows; KW: padded K; M_BUCKET keys the tuner
            M, N, K, NP, KW, M_BUCKET,
            # strides (elements)
            stride_gm, stride_wn, stride_sn, stride_om, stride_os,
            # meta
            SCALE_KIND: tl.constexpr, BF16: tl.constexpr, USE_ASM: tl.constexpr, ROW_SCALE: tl.constexpr,
            BM: tl.constexpr, BKO: tl.constexpr, BNR: tl.constexpr, SPLIT_X: tl.constexpr):
        """o[M, K] = g[M, N] @ W[N, K] (the backward input gradient), as o^T tiles [BKO, BM] = W_tile^T @ g^T.

        Grid (K_pad // BKO, S, cdiv(M, BM)): program (k, s, m) decodes a [BNR, BKO] weight tile per step over the
        s-th of S row ranges of W (the reduction), with the forward's decoder (SPLIT_X only sizes the grid). S > 1:
        fp32 partial tiles go to a workspace and the last program of a column block (arrival counter) sums them in
        split order, so the result is deterministic. ROW_SCALE (groups, whose rows carry different factors): each BNR-row block is scaled by
        its own factor (a block never straddles two members: they are padded to 128 rows); otherwise the one
        factor is applied to the fp32 result.
        """
        pid_k = tl.program_id(0)
        pid_s = tl.program_id(1)
        pid_m = tl.program_id(2)
        n_split = tl.num_programs(1)
        rows = tl.cdiv(tl.cdiv(NP, n_split), BNR) * BNR     # a trailing split may be empty: it adds zeros
        r0 = pid_s * rows
        r1 = tl.minimum(r0 + rows, NP)
        os_row = out_scale_ptr + BF16 * stride_os
        rw = pid_k * (BKO // 8) + tl.arange(0, BKO // 8)
        rs = pid_k * (BKO // 32) + tl.arange(0, BKO // 32)
        rm = pid_m * BM + tl.arange(0, BM)
        rb = tl.arange(0, BNR)
        m_ok = rm[None, :] < M
        acc = tl.zeros([BKO, BM], dtype=tl.float32)
        for n0 in range(r0, r1, BNR):
            rn = n0 + rb
            wq = tl.load(w_ptr + rn[:, None] * stride_wn + rw[None, :])
            sc = tl.load(s_ptr + rn[:, None] * stride_sn + rs[None, :])
            gt = tl.load(g_ptr + rm[None, :] * stride_gm + rn[:, None], mask=m_ok & (rn[:, None] < N), other=0.0)
            w = _decode_tile(wq, sc, BNR, BKO, SCALE_KIND, BF16, USE_ASM)            # [BNR, BKO]
            if ROW_SCALE:
                if USE_ASM:
                    part = tl.dot(tl.trans(w), gt)
                else:
                    part = tl.dot(tl.trans(w.to(tl.float32)), gt.to(tl.float32), input_precision="ieee")
                acc += part * tl.load(os_row + n0)
            else:
                if USE_ASM:
                    acc = tl.dot(tl.trans(w), gt, acc)
                else:
                    acc = tl.dot(tl.trans(w.to(tl.float32)), gt.to(tl.float32), acc, input_precision="ieee")
        if not ROW_SCALE:
            acc = acc * tl.load(os_row)
        rk = pid_k * BKO + tl.arange(0, BKO)
        o_ptrs = o_ptr + rm[None, :] * stride_om + rk[:, None]
        o_mask = m_ok & (rk[:, None] < K)
        if n_split == 1:
            tl.store(o_ptrs, acc.to(o_ptr.dtype.element_ty), mask=o_mask)
        else:
            tile = pid_m * tl.num_programs(0) + pid_k
            ws_tile = tl.arange(0, BKO)[:, None] * BM + tl.arange(0, BM)[None, :]
            tl.store(ws_ptr + (tile * n_split + pid_s) * (BKO * BM) + ws_tile, acc)
            tl.debug_barrier()
            arrived = tl.atomic_add(cnt_ptr + tile, 1, sem="acq_rel", scope="gpu")
            if arrived == n_split - 1:
                tot = tl.zeros([BKO, BM], dtype=tl.float32)
                for p in range(0, n_split):
                    tot += tl.load(ws_ptr + (tile * n_split + p) * (BKO * BM) + ws_tile, cache_modifier=".cg")
                tl.store(o_ptrs, tot.to(o_ptr.dtype.element_ty), mask=o_mask)
                tl.atomic_xchg(cnt_ptr + tile, 0)

    @triton.jit(do_not_specialize=["M", "M_BUCKET"])
    def _fp4_gemm_tc(
            # pointers (a: x for the forward, grad_y for the backward)
            a_ptr, w_ptr, s_ptr, out_scale_ptr, bias_ptr, o_ptr, t_ptr, lb_ptr, res_ptr,
            # sizes: o [M, NO] = a [M, KR] @ op(W); RP: the reduction length padded (K_pad or N_pad); WB: the
            # bound of the decoded tile's other side (forward: N_pad rows; backward: K_pad columns)
            M, NO, KR, RP, WB, M_BUCKET,
            # strides (elements)
            stride_am, stride_wn, stride_sn, stride_om, stride_os, stride_t, stride_res,
            # meta
            SCALE_KIND: tl.constexpr, BF16: tl.constexpr, HAS_BIAS: tl.constexpr, USE_ASM: tl.constexpr,
            FORWARD: tl.constexpr, HAS_LORA: tl.constexpr, R: tl.constexpr,
            HAS_RES: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr,
            TC_FWD: tl.constexpr = 1, TC_BWD: tl.constexpr = 1):
        """Tensor-core tiles for M >= 64 in the natural orientation: o tile [BM, BN] = a tile [BM, BK] @ B,
        B the weight tile decoded in registers and handed to the MMA through shared memory (Triton stages it).

        FORWARD: o = x @ W^T (NO = N, KR = K): B = decode(W[n-block, k-chunk])^T, per-column factors and bias in
        the epilogue. Backward (FORWARD False): o = grad_y @ W (NO = K, KR = N): B = decode(W[n-chunk, k-block]),
        one factor for the whole weight (single weights only). The decode is the stream-K kernel's (same layout,
        same bit operations), amortised over BM rows of activations instead of 16-64. Forward only: a LoRA update and
        the residual in the epilogue, as `_fp4_gemm`."""
        pid = tl.program_id(0)
        tiles_m = tl.cdiv(M, BM)
        tiles_n = tl.cdiv(NO, BN)
        in_group = GROUP_M * tiles_n
        first_m = (pid // in_group) * GROUP_M
        group_m = tl.minimum(tiles_m - first_m, GROUP_M)
        pid_m = first_m + (pid % in_group) % group_m
        pid_n = (pid % in_group) // group_m
        rm = pid_m * BM + tl.arange(0, BM)
        rn = pid_n * BN + tl.arange(0, BN)
        rk = tl.arange(0, BK)
        m_ok = rm < M
        out_scale = out_scale_ptr + BF16 * stride_os
        acc = tl.zeros([BM, BN], dtype=tl.float32)
        a_ptrs = a_ptr + rm[:, None] * stride_am + rk[None, :]
        if FORWARD:
            w_ok = (rn < WB)[:, None]
            w_ptrs = w_ptr + rn[:, None] * stride_wn + tl.arange(0, BK // 8)[None, :]
            s_ptrs = s_ptr + rn[:, None] * stride_sn + tl.arange(0, BK // 32)[None, :]
        else:
            w_ok = (pid_n * BN + tl.arange(0, BN // 8) * 8 < WB)[None, :]
            w_ptrs = w_ptr + rk[:, None] * stride_wn + pid_n * (BN // 8) + tl.arange(0, BN // 8)[None, :]
            s_ptrs = s_ptr + rk[:, None] * stride_sn + pid_n * (BN // 32) + tl.arange(0, BN // 32)[None, :]
        for r0 in range(0, RP, BK):
            a = tl.load(a_ptrs + r0, mask=m_ok[:, None] & (rk[None, :] < KR - r0), other=0.0)
            if FORWARD:
                wq = tl.load(w_ptrs + r0 // 8, mask=w_ok, other=0)
                sc = tl.load(s_ptrs + r0 // 32, mask=w_ok, other=0)
                w = tl.trans(_decode_tile(wq, sc, BN, BK, SCALE_KIND, BF16, USE_ASM))       # [BK, BN]
            else:
                wq = tl.load(w_ptrs + r0 * stride_wn, mask=w_ok, other=0)
                sc = tl.load(s_ptrs + r0 * stride_sn, mask=(pid_n * BN + tl.arange(0, BN // 32) * 32 < WB)[None, :],
                             other=0)
                w = _decode_tile(wq, sc, BK, BN, SCALE_KIND, BF16, USE_ASM)                 # [BK, BN]
            if USE_ASM:
                acc = tl.dot(a, w, acc)
            else:  # reference path (interpreter: no bf16 matmul); exact operands, fp32 products
                acc = tl.dot(a.to(tl.float32), w.to(tl.float32), acc, input_precision="ieee")
        o_mask = m_ok[:, None] & (rn < NO)[None, :]
        if FORWARD:
            out = acc * tl.load(out_scale + rn, mask=rn < NO, other=0.0)[None, :]
            if HAS_BIAS:
                out += tl.load(bias_ptr + rn, mask=rn < NO, other=0.0).to(tl.float32)[None, :]
            if HAS_LORA:
                rr = tl.arange(0, R)
                tt = tl.load(t_ptr + rm[:, None] * stride_t + rr[None, :], mask=m_ok[:, None], other=0.0)  # [BM, R]
                bt = tl.load(lb_ptr + rn[None, :] * R + rr[:, None], mask=(rn < NO)[None, :], other=0.0)   # [R, BN]
                if USE_ASM:
                    out += tl.dot(tt, bt)
                else:
                    out += tl.dot(tt.to(tl.float32), bt.to(tl.float32), input_precision="ieee")
            if HAS_RES:
                out += tl.load(res_ptr + rm[:, None] * stride_res + rn[None, :], mask=o_mask, other=0.0).to(tl.float32)
        else:
            out = acc * tl.load(out_scale)
        tl.store(o_ptr + rm[:, None] * stride_om + rn[None, :], out.to(o_ptr.dtype.element_ty), mask=o_mask)
