"""The skinny-M (M <= 16) FP4 W4A16 forward, y[M, N] = x[M, K] @ W^T, designed for bandwidth (issue 22, item 4).

Why: at decode sizes the product is a weight stream: 4.5 bits per weight, a handful of FLOPs each. The default
stream-K kernel (fp4_triton._fp4_gemm) runs about 2 CTAs of one warpgroup per SM and reached 39-40 % of the
measured read ceiling on 7B shapes at M 1-16 (kernels.notes.md, call 4; ncu: latency-bound, few eligible warps).
This kernel trades the big wgmma tile for many small independent CTAs, so that the GPU has many warps and many
bytes in flight:

1. Grid (row blocks of BN rows) x (SPLIT slices of K). The heuristic (`gemv_config`) aims at about 6 small CTAs
   per SM (3 in DOT mode): e.g. at M = 1, 18944 x 3584 runs 592 row blocks x 2 slices = 1184 CTAs of 4 warps and
   3584 x 18944 runs 112 x 8 = 896, so every SM holds several CTAs and the GPU has many 16-byte loads in flight.
2. FMA mode (M <= 4): a thread owns 4 consecutive words (one 16-byte load: 32 weights of one row) of each of a
   few rows per k-step of BW words. The project's E2M1 decoder (fp4_decoder._decode_words: bit ops and one
   packed multiply by the block scale, exact) gives the 8 values of each word; the fp32 FMAs take x from
   registers, loaded once per k-step and reused for all of the thread's rows: the two activations of a (q, r =
   0, 1) pair are one 4-byte load, addressed in the weight layout's own column order (layout.prepare_codes: word
   16t + 4c + b holds columns 128t + 32b + 8q + 2c + r), so x needs no re-layout pass. Each thread keeps one fp32
   accumulator per (row, word slot, M row) and the K threads reduce once, at the end.
   DOT mode (M 5-16, where CUDA-core FMAs cannot keep up with HBM: 8 * M FMAs per 4-byte word): the same grid,
   each k-step decodes a [BN, 8 * BW] tile (fp4_decoder._decode_tile) and multiplies it by x^T [8 * BW, 16] on
   the tensor cores (swap-AB, M padded to 16).
3. Block scale and weight are multiplied once (in the decoder, exact in fp16/bf16); the per-row factor
   (out_scales: the NVFP4 global scale or the MXFP4 re-bias, times the decoder's power of two) once per output.
4. Split-K partials are reduced deterministically: each CTA stores its [BN, MP] fp32 partial in a workspace,
   an arrival counter per row block (gpu-scope acq_rel atomic) elects the last CTA, which sums the SPLIT partials
   in a fixed order (up to 16 parts a load: one L2 round trip, where a part per load cost SPLIT of them), applies
   the factor and the bias and writes y; the counter resets itself. SPLIT = 1 writes y directly. Same result bit
   for bit from run to run.

Supports: NVFP4 and MXFP4 PreparedFP4 weights (single weights and `concat_prepared` groups, whose rows carry their
own factors), fp16 / bf16 activations, bias. Not supported (fp4_launch.fp4_gemm keeps the stream-K kernel for
them): the LoRA and residual epilogues, M > 16.

Dispatch (`selected`): the default forward (fp4_launch.fp4_gemm with no path forced) takes this kernel only where
MEASURED_WINS (a committed table of GPU measurements, filled from a `bench` run: device, format, dtype, N, K,
M bucket -> knobs) has an entry, or for every eligible call when QERL_FP4_GEMV=1 (QERL_FP4_GEMV=0: never).
The table holds the wins of one H100 run (issue 22, call 5): k/v at every M, q/o/down at M 8-16, the fused q/k/v
group (NVFP4); elsewhere the default path stays.

Run: tests/qerl_kernels/test_fp4_gemv.py (CPU interpreter: tiny shapes; GPU: the compiled kernel);
`python -m qerl_kernels.bench --models 7B --m 1 4 8 16` times it as nvfp4_gemv / mxfp4_gemv;
`python -m qerl_kernels.tune --gemv --shapes 18944x3584 3584x18944 --m 1 16` sweeps its knobs;
`bash qerl_kernels/run_device.sh gemv` does all three in one device call.
"""
from __future__ import annotations

import functools
import os

import torch

from qerl_kernels.fp4_decoder import HAVE_TRITON
from qerl_kernels.layout import PreparedFP4, interpret_mode

if HAVE_TRITON:
    import triton
    import triton.language as tl

    from qerl_kernels.fp4_decoder import _decode_tile, _decode_words
    from qerl_kernels.fp4_launch import _num_sms, _skinny_io, _use_asm, _workspace

__all__ = ["fp4_gemm_gemv", "launch_args", "gemv_config", "selected", "GEMV_MAX_M", "FMA_MAX_M", "MEASURED_WINS",
           "m_bucket", "compile_variants", "compile_variant"]

GEMV_MAX_M = 16  # DOT mode pads M to 16
FMA_MAX_M = 4    # FMA mode keeps one accumulator set per M row (MP 1, 2 or 4)

# Committed GPU measurements: (device key, scale_kind, dtype, N, K, M bucket) -> knobs (a `config` for
# fp4_gemm_gemv; {} = the heuristic's). An entry means: on that device this kernel beat the default path on that
# shape and M bucket in a `bench` run (its summary prints the entries to paste, "gemv wins"). Device key: "h100",
# "h200", ... (`_device_key`); scale_kind 0 NVFP4, 1 MXFP4; dtype "bf16" / "fp16"; N, K the weight's (a group's N
# is its rows, padding included). Filled from issue 22's call 5 (H100, 2026-11-26, results/measured/h100/kernels/call5/:
# every entry at most 0.97x the default path's time in the same run; gate/up and the M = 1 q/o/down launches stayed
# with the default path, which was as fast or faster there).
MEASURED_WINS: dict[tuple, dict] = {
    ('h100', 1, 'bf16', 512, 3584, 1): {},  # k_proj M=1: gemv 5.3 us, default 6.9 us
    ('h100', 1, 'bf16', 512, 3584, 4): {},  # k_proj M=4: gemv 6.8 us, default 7.3 us
    ('h100', 1, 'bf16', 512, 3584, 8): {},  # k_proj M=8: gemv 6.1 us, default 7.3 us
    ('h100', 1, 'bf16', 512, 3584, 16): {},  # k_proj M=16: gemv 6.2 us, default 7.3 us
    ('h100', 1, 'bf16', 3584, 3584, 8): {},  # q_proj M=8: gemv 9.1 us, default 11.2 us
    ('h100', 1, 'bf16', 3584, 18944, 8): {},  # down_proj M=8: gemv 21.5 us, default 24.4 us
    ('h100', 1, 'bf16', 3584, 3584, 16): {},  # q_proj M=16: gemv 9.1 us, default 11.3 us
    ('h100', 1, 'bf16', 3584, 18944, 16): {},  # down_proj M=16: gemv 21.9 us, default 24.5 us
    ('h100', 0, 'bf16', 512, 3584, 1): {},  # k_proj M=1: gemv 5.4 us, default 6.8 us
    ('h100', 0, 'bf16', 512, 3584, 4): {},  # k_proj M=4: gemv 6.7 us, default 7.3 us
    ('h100', 0, 'bf16', 512, 3584, 8): {},  # k_proj M=8: gemv 6.2 us, default 7.3 us
    ('h100', 0, 'bf16', 512, 3584, 16): {},  # k_proj M=16: gemv 6.2 us, default 7.3 us
    ('h100', 0, 'bf16', 3584, 3584, 8): {},  # q_proj M=8: gemv 9.2 us, default 10.8 us
    ('h100', 0, 'bf16', 3584, 18944, 8): {},  # down_proj M=8: gemv 22.2 us, default 24.5 us
    ('h100', 0, 'bf16', 3584, 3584, 16): {},  # q_proj M=16: gemv 9.1 us, default 10.9 us
    ('h100', 0, 'bf16', 3584, 18944, 16): {},  # down_proj M=16: gemv 22.5 us, default 25.0 us
    ('h100', 0, 'bf16', 4608, 3584, 1): {},  # qkv_proj M=1: gemv 10.5 us, default 11.9 us
    ('h100', 0, 'bf16', 4608, 3584, 8): {},  # qkv_proj M=8: gemv 10.1 us, default 12.2 us
    ('h100', 0, 'bf16', 4608, 3584, 16): {},  # qkv_proj M=16: gemv 10.2 us, default 12.3 us
}


if HAVE_TRITON:
    @triton.jit
    def _pair_to_f32(v, BF16: tl.constexpr):
        """int32 holding two fp16/bf16 activations (x[2i] low, x[2i + 1] high) -> two float32 tensors."""
        if BF16:
            lo = (v << 16).to(tl.float32, bitcast=True)
            hi = (v & -65536).to(tl.float32, bitcast=True)
        else:
            lo = (v & 0xFFFF).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
            hi = ((v >> 16) & 0xFFFF).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
        return lo, hi

    @triton.jit
    def _fma_row(acc, o0, o1, o2, o3, o4, o5, o6, o7, xp, pair0, lim, M, ROW: tl.constexpr, BF16: tl.constexpr,
                 EVEN_K: tl.constexpr):
        """acc [BN, BW] += the 8 decoded values of each word times their activations, for one M row. xp [BW]:
        pointers to the int32 activation pair q = 0 of each word (pair q sits 4 pairs further); pair0 [BW]: its
        index relative to the k-step, lim: the pairs left before K (EVEN_K: no K mask); ROW: the M row."""
        row_ok = (pair0 * 0 + ROW) < M
        if EVEN_K:
            m0 = row_ok
            m1 = m0
            m2 = m0
            m3 = m0
        else:
            m0 = row_ok & (pair0 < lim)
            m1 = row_ok & (pair0 + 4 < lim)
            m2 = row_ok & (pair0 + 8 < lim)
            m3 = row_ok & (pair0 + 12 < lim)
        a0, a1 = _pair_to_f32(tl.load(xp, mask=m0, other=0), BF16)
        a2, a3 = _pair_to_f32(tl.load(xp + 4, mask=m1, other=0), BF16)
        a4, a5 = _pair_to_f32(tl.load(xp + 8, mask=m2, other=0), BF16)
        a6, a7 = _pair_to_f32(tl.load(xp + 12, mask=m3, other=0), BF16)
        acc += o0.to(tl.float32) * a0[None, :] + o1.to(tl.float32) * a1[None, :]
        acc += o2.to(tl.float32) * a2[None, :] + o3.to(tl.float32) * a3[None, :]
        acc += o4.to(tl.float32) * a4[None, :] + o5.to(tl.float32) * a5[None, :]
        acc += o6.to(tl.float32) * a6[None, :] + o7.to(tl.float32) * a7[None, :]
        return acc

    @triton.jit
    def _gemv_store(tile, rn, rbm, os_ptr, bias_ptr, y_ptr, M, N, stride_ym, HAS_BIAS: tl.constexpr):
        """y[m, n] = tile[n, m] * factor[n] (+ bias[n]) for n < N, m < M."""
        out = tile * tl.load(os_ptr + rn, mask=rn < N, other=0.0)[:, None]
        if HAS_BIAS:
            out += tl.load(bias_ptr + rn, mask=rn < N, other=0.0).to(tl.float32)[:, None]
        mask = (rn < N)[:, None] & (rbm < M)[None, :]
        tl.store(y_ptr + rbm[None, :] * stride_ym + rn[:, None], out.to(y_ptr.dtype.element_ty), mask=mask)

    @triton.jit(do_not_specialize=["M"])
    def _fp4_gemv(
            # pointers (x32: the activations as int32 pairs)
            x_ptr, x32_ptr, w_ptr, s_ptr, os_ptr, bias_ptr, y_ptr, ws_ptr, cnt_ptr,
            # sizes: KWW = padded K in words (K_pad // 8)
            M, N, K, KWW,
            # strides (elements; stride_x32 in int32 pairs)
            stride_xm, stride_x32, stride_wn, stride_sn, stride_ym, stride_os,
            # meta
            SCALE_KIND: tl.constexpr, BF16: tl.constexpr, HAS_BIAS: tl.constexpr, USE_ASM: tl.constexpr,
            DOT: tl.constexpr, MP: tl.constexpr, BN: tl.constexpr, BW: tl.constexpr, EVEN_K: tl.constexpr,
            RED: tl.constexpr = 16):
        """Program (pid_n, pid_s): rows pid_n * BN + [0, BN), the pid_s-th of SPLIT (the grid's second dimension,
        so that the split is no compile-time constant) equal runs of k-steps of BW words (8 * BW columns). Result
        tile [BN, MP] (fp32, before the per-row factor) -> y or the workspace. RED: partials per reduction load."""
        pid_n = tl.program_id(0)
        pid_s = tl.program_id(1)
        SPLIT = tl.num_programs(1)
        steps = tl.cdiv(KWW, BW)
        per = tl.cdiv(steps, SPLIT)
        st0 = pid_s * per
        st1 = tl.minimum(st0 + per, steps)
        rn = pid_n * BN + tl.arange(0, BN)
        rbm = tl.arange(0, MP)
        os_row = os_ptr + BF16 * stride_os
        if DOT:
            rw = tl.arange(0, BW)
            rs = tl.arange(0, BW // 4)
            rk = tl.arange(0, BW * 8)
            w_ptrs = w_ptr + rn[:, None] * stride_wn + rw[None, :]
            s_ptrs = s_ptr + rn[:, None] * stride_sn + rs[None, :]
            x_ptrs = x_ptr + rbm[None, :] * stride_xm + rk[:, None]
            m_ok = rbm[None, :] < M
            tile = tl.zeros([BN, MP], dtype=tl.float32)
            for st in range(st0, st1):
                w0 = st * BW
                if EVEN_K:
                    wq = tl.load(w_ptrs + w0)
                    sc = tl.load(s_ptrs + w0 // 4)
                    xt = tl.load(x_ptrs + w0 * 8, mask=m_ok, other=0.0)
                else:  # the last step may pass K_pad (weights) and K (activations)
                    wq = tl.load(w_ptrs + w0, mask=(rw < KWW - w0)[None, :], other=0)
                    sc = tl.load(s_ptrs + w0 // 4, mask=(rs < (KWW - w0) // 4)[None, :], other=0)
                    xt = tl.load(x_ptrs + w0 * 8, mask=m_ok & (rk[:, None] < K - w0 * 8), other=0.0)
                w = _decode_tile(wq, sc, BN, BW * 8, SCALE_KIND, BF16, USE_ASM)
                if USE_ASM:
                    tile = tl.dot(w, xt, tile)
                else:  # interpreter: exact operands, fp32 products
                    tile = tl.dot(w.to(tl.float32), xt.to(tl.float32), tile, input_precision="ieee")
        else:
            rw = tl.arange(0, BW)
            w_ptrs = w_ptr + rn[:, None] * stride_wn + rw[None, :]
            # word 16t + 4c + b: its block-scale entry is 4t + b, its columns 128t + 32b + 8q + 2c + r, i.e.
            # the int32 activation pairs 64t + 16b + 4q + c (q = 0..3)
            s_ptrs = s_ptr + rn[:, None] * stride_sn + ((rw // 16) * 4 + rw % 4)[None, :]
            pair0 = (rw // 16) * 64 + (rw % 4) * 16 + (rw // 4) % 4
            xp = x32_ptr + pair0
            acc0 = tl.zeros([BN, BW], dtype=tl.float32)
            acc1 = tl.zeros([BN, BW], dtype=tl.float32)
            acc2 = tl.zeros([BN, BW], dtype=tl.float32)
            acc3 = tl.zeros([BN, BW], dtype=tl.float32)
            # the next k-step's words and scales are loaded before this one's decode (a register double buffer),
            # so each thread has its next 16-byte loads in flight while it computes
            lim = tl.minimum(st1 * BW, KWW)
            k_ok = (rw + st0 * BW < lim)[None, :]
            wq = tl.load(w_ptrs + st0 * BW, mask=k_ok, other=0)
            sc = tl.load(s_ptrs + st0 * BW // 4, mask=k_ok, other=0)
            for st in range(st0, st1):
                w0 = st * BW
                k_ok = (rw + w0 + BW < lim)[None, :]
                wq_next = tl.load(w_ptrs + w0 + BW, mask=k_ok, other=0)
                sc_next = tl.load(s_ptrs + (w0 + BW) // 4, mask=k_ok, other=0)
                o0, o1, o2, o3, o4, o5, o6, o7 = _decode_words(wq, sc.to(tl.int16), SCALE_KIND, BF16, USE_ASM)
                xs = xp + w0 * 4
                left = K // 2 - w0 * 4
                acc0 = _fma_row(acc0, o0, o1, o2, o3, o4, o5, o6, o7, xs, pair0, left, M, 0, BF16, EVEN_K)
                if MP > 1:
                    acc1 = _fma_row(acc1, o0, o1, o2, o3, o4, o5, o6, o7, xs + stride_x32, pair0, left, M, 1,
                                    BF16, EVEN_K)
                if MP > 2:
                    acc2 = _fma_row(acc2, o0, o1, o2, o3, o4, o5, o6, o7, xs + 2 * stride_x32, pair0, left, M, 2,
                                    BF16, EVEN_K)
                    acc3 = _fma_row(acc3, o0, o1, o2, o3, o4, o5, o6, o7, xs + 3 * stride_x32, pair0, left, M, 3,
                                    BF16, EVEN_K)
                wq = wq_next
                sc = sc_next
            if MP == 1:
                tile = tl.sum(acc0, axis=1)[:, None]
            elif MP == 2:
                tile = tl.join(tl.sum(acc0, axis=1), tl.sum(acc1, axis=1))
            else:
                # join adds the last dim: [n, k, i] = row 2k + i
                tile = tl.reshape(tl.join(tl.join(tl.sum(acc0, axis=1), tl.sum(acc2, axis=1)),
                                          tl.join(tl.sum(acc1, axis=1), tl.sum(acc3, axis=1))), [BN, MP])
        if SPLIT == 1:
            _gemv_store(tile, rn, rbm, os_row, bias_ptr, y_ptr, M, N, stride_ym, HAS_BIAS)
        else:
            # park the partial; the last of the SPLIT programs of this row block sums them in a fixed order
            ws_tile = tl.arange(0, BN)[:, None] * MP + rbm[None, :]
            tl.store(ws_ptr + (pid_n * SPLIT + pid_s) * (BN * MP) + ws_tile, tile)
            tl.debug_barrier()  # every thread's store precedes the one arrival (release is cumulative)
            arrived = tl.atomic_add(cnt_ptr + pid_n, 1, sem="acq_rel", scope="gpu")
            if arrived == SPLIT - 1:
                # RED partials a load, so the sum costs one L2 latency per RED parts, not one per part
                tot = tl.zeros([BN, MP], dtype=tl.float32)
                for p0 in range(0, SPLIT, RED):
                    rp = p0 + tl.arange(0, RED)
                    part = tl.load(ws_ptr + (pid_n * SPLIT + rp)[:, None, None] * (BN * MP) + ws_tile[None, :, :],
                                   mask=(rp < SPLIT)[:, None, None], other=0.0, cache_modifier=".cg")
                    tot += tl.sum(part, axis=0)
                _gemv_store(tot, rn, rbm, os_row, bias_ptr, y_ptr, M, N, stride_ym, HAS_BIAS)
                tl.atomic_xchg(cnt_ptr + pid_n, 0)


def m_bucket(m: int) -> int:
    """The M bucket of MEASURED_WINS: 1, 4, 8 or 16 (the bench's M values; 2-3 share 4's entry, 5-7 8's)."""
    return 1 if m <= 1 else 4 if m <= 4 else 8 if m <= 8 else 16


def gemv_config(m: int, n_pad: int, k_words: int, n_sm: int, cps: int | None = None) -> dict:
    """The heuristic knobs for M rows, N_pad weight rows and K_pad / 8 words, on n_sm SMs (cps: CTAs per SM to
    aim at, default FMA 6, DOT 3).

    Why these values (reasoned and read off sm_90 builds on the CPU machine with Triton 3.6, the GPU image's, and
    3.9; not yet swept on a GPU: `tune --gemv` sweeps them): FMA mode for M <= 4 (8 * M fp32 FMAs per 4-byte word
    stay under the FMA pipe's share of HBM bandwidth there), DOT above. FMA, M = 1: BN 32 rows x BW 64 words (256
    bytes of a row per k-step: 16 threads of 16 bytes across the row, 2 rows per warp, 4 rows per thread at 4
    warps; 128 registers with the double buffer, no spills: 4 CTAs per SM); M 2-4: BN 16 x BW 32 (2 rows per
    thread, 128 registers at M = 4, where 32 x 64 needs 234 at M = 2 with Triton 3.6). DOT: the swap-AB tile [64,
    256] with 3 cp.async stages (one warpgroup, the default kernel's decode tile; 122 registers, 43 KB of shared
    memory). SPLIT: enough K slices that the grid has about CPS CTAs per SM (FMA 6, DOT 3: several waves of small
    CTAs), at most one slice per k-step and 16 in all (the last CTA's serial sum).
    """
    dot = m > FMA_MAX_M
    bn, bw, nw, ns, c = (64, 32, 4, 3, 3) if dot else (32, 64, 4, 1, 6) if m == 1 else (16, 32, 4, 1, 6)
    return dict(DOT=dot, BN=bn, BW=bw, SPLIT=_split_for(n_pad, k_words, bn, bw, (cps or c) * n_sm), num_warps=nw,
                num_stages=ns)


def _split_for(n_pad: int, k_words: int, bn: int, bw: int, target_ctas: int) -> int:
    blocks = -(-n_pad // bn)
    steps = -(-k_words // bw)
    split = max(1, min(16, steps, -(-target_ctas // blocks)))
    per = -(-steps // split)
    return -(-steps // per)  # no empty slices


@functools.lru_cache(maxsize=None)
def _device_key(index: int) -> str:
    name = torch.cuda.get_device_name(index)
    for key in ("H200", "H100", "B200", "A100", "L40S", "L4"):
        if key in name:
            return key.lower()
    return name.replace("NVIDIA ", "").split()[0].lower()


def selected(x: torch.Tensor, w) -> dict | None:
    """The knobs to run this call with if the default forward should take this kernel, else None.

    QERL_FP4_GEMV=1: every eligible call (single weight or group, M <= 16, CUDA or the interpreter) with the
    heuristic's knobs; QERL_FP4_GEMV=0: never; unset: only where MEASURED_WINS has the (device, format, dtype, N,
    K, M bucket) entry. LoRA / residual epilogues are the caller's to exclude (fp4_launch.fp4_gemm does)."""
    mode = os.environ.get("QERL_FP4_GEMV", "")
    m = x.shape[0]
    if mode == "0" or not HAVE_TRITON or not 1 <= m <= GEMV_MAX_M:
        return None
    if mode == "1":
        return {}
    if not x.is_cuda or not MEASURED_WINS:
        return None
    key = (_device_key(x.device.index or 0), w.scale_kind, "bf16" if x.dtype == torch.bfloat16 else "fp16", w.n,
           w.k, m_bucket(m))
    return MEASURED_WINS.get(key)


def fp4_gemm_gemv(x: torch.Tensor, w: PreparedFP4, bias: torch.Tensor | None = None, *,
                  config: dict | None = None) -> torch.Tensor:
    """y = x @ W^T (+ bias), M <= 16, fp32 accumulation, output in x's dtype (this module's kernel).

    Args:
        x: [M, K] float16/bfloat16 on the weight's device (CUDA, or CPU under TRITON_INTERPRET=1), M <= 16.
        w: PreparedFP4 (single weight or `concat_prepared` group; NVFP4 or MXFP4).
        bias: optional [N].
        config: knobs overriding the heuristic (`gemv_config`): DOT (bool), BN (rows per CTA, a power of two in
            16..128), BW (words per k-step, a power of two >= 16), SPLIT (K slices) or CPS (CTAs per SM to aim
            at; SPLIT follows), num_warps, num_stages. Absent knobs: the heuristic's for the resulting mode.

    Returns:
        [M, N] tensor.

    Raises:
        ValueError: shape, dtype or device mismatch, M > 16, FMA mode above M = 4, or bad knobs.
    """
    x, y = _skinny_io(x, w, bias, GEMV_MAX_M, "fp4_gemm_gemv")
    if x.shape[0] == 0:
        return y
    n_sm = 2 if interpret_mode() else _num_sms(x.device.index or 0)
    grid, args, meta = launch_args(x, w, bias, y, n_sm, config)
    _fp4_gemv[grid](*args, **meta)
    return y


def launch_args(x: torch.Tensor, w: PreparedFP4, bias: torch.Tensor | None, y: torch.Tensor, n_sm: int,
                config: dict | None = None) -> tuple[tuple, tuple, dict]:
    """(grid, positional arguments, meta-parameters) of one `_fp4_gemv` launch computing y = x @ W^T (+ bias).

    The one place that turns the knobs into a launch: fp4_gemm_gemv launches what it returns, and the offline
    compile check (`python -m qerl_kernels.fp4_gemv`) compiles it from CPU tensors of the same shapes and dtypes.
    x must be contiguous with a 4-byte aligned start (fp4_gemm_gemv sees to it).

    Raises:
        ValueError: knobs the kernel does not support (the message names them).
    """
    m = x.shape[0]
    n_pad, kww = w.words.shape[0], w.words.shape[1]
    config = dict(config or {})
    cps = config.pop("CPS", None)
    cfg = gemv_config(m, n_pad, kww, n_sm, cps)
    if "DOT" in config and bool(config["DOT"]) != cfg["DOT"]:  # the other mode: its own defaults
        cfg = gemv_config(FMA_MAX_M + 1 if config["DOT"] else 1, n_pad, kww, n_sm, cps)
    cfg.update(config)
    dot, bn, bw = bool(cfg["DOT"]), int(cfg["BN"]), int(cfg["BW"])
    if "SPLIT" not in config:
        cfg["SPLIT"] = _split_for(n_pad, kww, bn, bw, (cps or (3 if dot else 6)) * n_sm)
    split = int(cfg["SPLIT"])
    mp = 16 if dot else 1 << (m - 1).bit_length()
    if (not dot and m > FMA_MAX_M) or bn < 16 or bn > 128 or bn & (bn - 1) or bw < 16 or bw & (bw - 1) or \
            not 1 <= split <= -(-kww // bw):
        raise ValueError(f"fp4_gemm_gemv: bad knobs {cfg} for M = {m}, {kww} words per row (FMA mode takes "
                         f"M <= {FMA_MAX_M}; BN a power of two in 16..128, BW one >= 16; SPLIT <= k-steps)")
    blocks = -(-w.n // bn)
    ws, cnt = _workspace(x.device, blocks * split * bn * mp if split > 1 else 1, blocks)
    dummy = w.out_scales
    x32 = x.view(torch.int32)  # K is a multiple of 16 for both formats: whole pairs per row
    args = (x, x32, w.words, w.scales, w.out_scales, bias.contiguous() if bias is not None else dummy, y, ws, cnt,
            m, w.n, w.k, kww,
            x.stride(0), x32.stride(0), w.words.stride(0), w.scales.stride(0), y.stride(0), w.out_scales.stride(0))
    meta = dict(SCALE_KIND=w.scale_kind, BF16=x.dtype == torch.bfloat16, HAS_BIAS=bias is not None,
                USE_ASM=_use_asm(interpret_mode()), DOT=dot, MP=mp, BN=bn, BW=bw,
                EVEN_K=w.k == kww * 8 and kww % bw == 0, RED=min(16, max(1, 4096 // (bn * mp))),
                num_warps=int(cfg.get("num_warps", 4)),
                num_stages=int(cfg.get("num_stages", 1)))
    return (blocks, split), args, meta


# ---------------------------------------------------------------------------------------------------------------
# Offline compile check: `python -m qerl_kernels.fp4_gemv [--only NAME ...] [--json]` builds the launches below for
# sm_90 on any machine (no GPU: Triton compiles for a target it does not have, ptxas is bundled) and reports
# registers, spills and shared memory per variant, so a compile error or a spill shows before a device call.
# ---------------------------------------------------------------------------------------------------------------
def compile_variants() -> dict[str, tuple]:
    """{name: (N, K, M, scale_kind, bf16, bias, config)}: the heuristic's launches on the 7B gate/up and down
    shapes at M = 1, 2, 4, 8, 16, plus fp16 + MXFP4 + bias and the ragged-K case (K = 400)."""
    out = {f"gate-m{m}": (18944, 3584, m, 0, True, False, None) for m in (1, 2, 4, 8, 16)}
    out.update({f"down-m{m}": (3584, 18944, m, 0, True, False, None) for m in (1, 16)})
    out.update({"mx-fp16-bias-m1": (18944, 3584, 1, 1, False, True, None),
                "mx-fp16-bias-m16": (18944, 3584, 16, 1, False, True, None),
                "ragged-m3": (200, 400, 3, 0, True, True, None)})
    return out


def compile_variant(name: str, arch: int = 90) -> dict:
    """Compile one of `compile_variants` for `arch` from CPU tensors (never filled): registers, spills, shared
    memory, or the error. Must run in a process where the Triton interpreter has not run."""
    from qerl_kernels.gluon_compile import compile_launch, empty_prepared, ptxas_usage
    n, k, m, kind, bf16, bias, cfg = compile_variants()[name]
    dt = torch.bfloat16 if bf16 else torch.float16
    w = empty_prepared(n, k, kind)
    x, y = torch.empty(m, k, dtype=dt), torch.empty(m, n, dtype=dt)
    grid, args, meta = launch_args(x, w, torch.empty(n, dtype=dt) if bias else None, y, 132, cfg)
    try:
        compiled = compile_launch(_fp4_gemv, args, dict(meta, USE_ASM=True, debug=False), arch)
        use = ptxas_usage(compiled.asm["ptx"], compiled.metadata, arch)
    except Exception as e:  # noqa: BLE001 - reported as the variant's status
        return dict(name=name, status=f"{type(e).__name__}: {str(e).splitlines()[0][:200]}")
    knob = {key: meta[key] for key in ("DOT", "MP", "BN", "BW", "num_warps", "num_stages")}
    return dict(name=name, status="ok", grid=list(grid), **knob, regs=use["regs"], spill_st=use["spill_st"],
                spill_ld=use["spill_ld"], smem=compiled.metadata.shared)


def main(argv=None) -> int:
    from qerl_kernels.gluon_compile import variants_main
    return variants_main(argv, "offline sm_90 compile check of the skinny-M kernel (no GPU needed)",
                         list(compile_variants()), compile_variant)


if __name__ == "__main__":
    raise SystemExit(main())
