"""Fused kernels of one decode step (one new token per row), with the plain-torch reference each is tested against.

Why: at rollout batch sizes the decode step of a 7B model is a few milliseconds, and a step built from framework
ops launches about 30 kernels per decoder layer (RMSNorm's reductions, RoPE's slices and concatenations, the cache
writes, attention's score/softmax/PV passes, the SiLU, each LoRA product), each a few microseconds even inside a
CUDA graph. These kernels make a layer a handful of launches; with the projections (qerl_kernels.fp4_gemm or cuBLAS) and
the LoRA down-products (cuBLAS; at batch 1 the split kernel below; o's in the attention's combine kernel) a layer is
14 launches for NVFP4 + LoRA and 18 for BF16 + LoRA at batch 8, 10 and 14 at batch 1 (7B, H100 step trace:
qerl/rl/engine.py).

    rmsnorm(h, w, eps, add=y)                    h += y (in place, if given); returns rmsnorm(h) * w
    rmsnorm_lora(h, w, eps, a)                   (x, t): x = rmsnorm(h) * w and the LoRA down-products t = x a^T of
                                                 the projections that read x, in one launch (instead of a norm
                                                 kernel and a cuBLAS GEMM: two launches, split-K and reduction);
                                                 split over the hidden size, the last program of a row block sums
                                                 the partials
    lora_down(x, a)                              t = x a^T: the same kernel without the norm (o and down's LoRA)
    qkv_rope_cache(q, k, v, t, lora_b, bias, cos, sin, pos, slot, k_cache, v_cache)
        q/k/v projections + their LoRA update (t @ B^T) + bias, RoPE on q and k, k and v written to cache slot
        `slot`; returns the rotated queries [B, heads, d]
    decode_attention(q, k_cache, v_cache, valid, slot, span, scale, lora_a=None)
        one query per row and head against the cache slots [0, slot] (valid ones, plus the slot itself),
        split over the keys (flash-decoding: partial softmax per split, then a combine); returns [B, heads * d];
        with lora_a (o's LoRA A factors) the combine kernel also returns t = out lora_a^T
    silu_mul(gate, up, t, lora_b)               silu(gate + t_g B_g^T) * (up + t_u B_u^T)
    silu_mul_lora(gate, up, t, lora_b, a)       (m, t_d): m = silu_mul(...) and down's LoRA down-products t_d = m a^T,
                                                one launch of the split kernel (where silu_mul and lora_down are two)
    sample_gumbel(logits, temperature, seed, step, top_p)
                                                one token per row from softmax(logits / T) by Gumbel-max, with its
                                                log-prob and the distribution's entropy: two passes over each row's
                                                logits in one kernel (torch's ops make ~35 passes over [B, V] float32
                                                tensors a step: for SmolLM2-135M at 128 rows ~0.9 GB, estimated from
                                                the shapes, beside ~0.3 GB of weights; 282 -> 48 us on an H100)
Each dispatches to Triton when `use_triton` (CUDA, or the CPU interpreter with TRITON_INTERPRET=1), else to the
`*_reference` function beside it; both compute in float32 and round once to the activations' dtype (the references
round where the model does: a residual sum, the normalised row, the product with the norm weight).

Numerics vs transformers' Qwen2 forward (deviations, all within bf16 rounding): LoRA deltas and biases are added in
float32 to the rounded base projection; RoPE is computed in float32 and rounded once (transformers rounds q*cos and
rotate_half(q)*sin separately in bf16); attention normalises after the PV product (flash-decoding order) with the
probabilities rounded to the compute dtype for the PV product, as the engine's torch path does.

Run the tests: `TRITON_INTERPRET=1 pytest tests/qerl_kernels/test_decode.py -q` (CPU), `pytest tests/qerl_kernels` on
a GPU. The 7B step's launches built for sm_90 without a GPU (registers, spills, SASS, loads before the first
barrier): `python -m qerl_kernels.decode_compile`.
"""
from __future__ import annotations

import os

import torch

from qerl_kernels.fp4_decoder import HAVE_TRITON

if HAVE_TRITON:
    import triton
    import triton.language as tl

__all__ = ["sample_gumbel", "sample_gumbel_pays", "rmsnorm", "rmsnorm_reference", "rmsnorm_lora",
           "rmsnorm_lora_reference", "LORA_SPLIT_MAX_ROWS", "lora_split_max_rows", "LORA_SPLITS", "lora_block",
           "lora_down", "lora_splits", "qkv_rope_cache", "qkv_rope_cache_reference", "decode_attention",
           "decode_attention_reference", "attention_splits", "silu_mul", "silu_mul_reference", "silu_mul_lora",
           "SILU_LORA_SPLITS", "lora_rank_pad", "ROPE_ONE_ROW"]


def lora_rank_pad(r: int) -> int:
    """The padded LoRA rank the kernels take (a power of two >= 16: tl.dot's smallest inner dimension)."""
    return max(16, 1 << (max(r, 1) - 1).bit_length())


# --------------------------------------------------------------------------------------------------------------
# References (the specification; the engine's CPU path)
# --------------------------------------------------------------------------------------------------------------
def rmsnorm_reference(h: torch.Tensor, weight: torch.Tensor, eps: float, add: torch.Tensor | None = None):
    """transformers' Qwen2RMSNorm of h (+ add, rounded to h's dtype and written back into h)."""
    if add is not None:
        h.add_(add)
    x = h.float()
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x.to(h.dtype)


def rmsnorm_lora_reference(h: torch.Tensor, weight: torch.Tensor, eps: float, a: torch.Tensor):
    """(rmsnorm_reference(h) * weight, its product with a^T rounded to h's dtype)."""
    x = rmsnorm_reference(h, weight, eps)
    return x, torch.nn.functional.linear(x, a)


def _lora_delta(t: torch.Tensor | None, lora_b: torch.Tensor | None, col0: int, rows: slice):
    if t is None:
        return 0.0
    r = lora_b.shape[1]
    return t[..., col0:col0 + r].float() @ lora_b[rows].float().t()


def qkv_rope_cache_reference(q, k, v, t, lora_b, bias, cos, sin, pos, slot, k_cache, v_cache):
    """See `qkv_rope_cache`; q/k/v [B, T, n] (T tokens written to slots slot..slot+T-1, T = 1 at decode)."""
    bsz, tt = q.shape[:2]
    d = cos.shape[-1]
    nq, nk = q.shape[-1], k.shape[-1]
    r = lora_b.shape[1] if lora_b is not None else 0
    outs = []
    for i, (y, row0, n) in enumerate(((q, 0, nq), (k, nq, nk), (v, nq + nk, nk))):
        y = y.float() + _lora_delta(t, lora_b, i * r, slice(row0, row0 + n))
        if bias is not None:
            y = y + bias[row0:row0 + n].float()
        outs.append(y.view(bsz, tt, n // d, d))
    c, s = cos[pos].float().unsqueeze(2), sin[pos].float().unsqueeze(2)  # [B, T, 1, d]

    def rope(x):
        half = d // 2
        rot = torch.cat((-x[..., half:], x[..., :half]), -1)
        return x * c + rot * s

    qr, kr = rope(outs[0]).to(q.dtype), rope(outs[1]).to(q.dtype)
    slots = slot.reshape(-1)[:1] + torch.arange(tt, device=slot.device)
    k_cache.index_copy_(2, slots, kr.transpose(1, 2).to(k_cache.dtype))
    v_cache.index_copy_(2, slots, outs[2].to(q.dtype).transpose(1, 2).to(v_cache.dtype))
    return qr  # [B, T, heads, d]


def decode_attention_reference(q, k_cache, v_cache, valid, slot, span: int, scale: float):
    """See `decode_attention`; the engine's torch attention for one query per row (softmax in float32)."""
    bsz, heads, d = q.shape
    kvh = k_cache.shape[1]
    g = heads // kvh
    s = slot.reshape(-1)[:1]
    keys = torch.arange(span, device=q.device)
    allowed = ((keys < s) & valid[:, :span].bool()) | (keys == s)  # [B, S]
    kk = k_cache[:, :, :span]  # [B, kvh, S, d]
    qg = q.view(bsz, kvh, g, d)
    scores = torch.einsum("bhgd,bhsd->bhgs", qg.float(), kk.float()) * scale
    scores = scores.masked_fill(~allowed[:, None, None, :], float("-inf"))
    p = torch.softmax(scores, dim=-1).to(q.dtype)
    o = torch.einsum("bhgs,bhsd->bhgd", p.float(), v_cache[:, :, :span].float())
    return o.reshape(bsz, heads * d).to(q.dtype)


def silu_mul_reference(gate, up, t, lora_b):
    """See `silu_mul`."""
    inter = gate.shape[-1]
    r = lora_b.shape[1] if lora_b is not None else 0
    g = gate.float() + _lora_delta(t, lora_b, 0, slice(0, inter))
    u = up.float() + _lora_delta(t, lora_b, r, slice(inter, 2 * inter))
    return (torch.nn.functional.silu(g) * u).to(gate.dtype)


# --------------------------------------------------------------------------------------------------------------
# Triton kernels
# --------------------------------------------------------------------------------------------------------------
if HAVE_TRITON:
    @triton.jit
    def _rmsnorm_kernel(h_ptr, y_ptr, w_ptr, x_ptr, H, stride_h, stride_y, stride_x, eps,
                        HAS_ADD: tl.constexpr, BH: tl.constexpr, NB: tl.constexpr):
        """One program per row: h += y (rounded to h's dtype, written back), x = bf16(h * rstd) * w."""
        row = tl.program_id(0).to(tl.int64)
        ss = tl.zeros([BH], dtype=tl.float32)
        for c in range(NB):
            cols = c * BH + tl.arange(0, BH)
            ok = cols < H
            h = tl.load(h_ptr + row * stride_h + cols, mask=ok, other=0.0)
            if HAS_ADD:
                h = (h.to(tl.float32) + tl.load(y_ptr + row * stride_y + cols, mask=ok, other=0.0).to(tl.float32))
                h = h.to(h_ptr.dtype.element_ty)
                tl.store(h_ptr + row * stride_h + cols, h, mask=ok)
            hf = h.to(tl.float32)
            ss += hf * hf
        rstd = 1.0 / tl.sqrt_rn(tl.sum(ss, axis=0) / H + eps)
        for c in range(NB):
            cols = c * BH + tl.arange(0, BH)
            ok = cols < H
            h = tl.load(h_ptr + row * stride_h + cols, mask=ok, other=0.0).to(tl.float32)
            xn = (h * rstd).to(x_ptr.dtype.element_ty).to(tl.float32)
            w = tl.load(w_ptr + cols, mask=ok, other=0.0).to(tl.float32)
            tl.store(x_ptr + row * stride_x + cols, (xn * w).to(x_ptr.dtype.element_ty), mask=ok)

    @triton.jit
    def _silu_cols(g, u_ptr, tg_ptr, b_ptr, rows, r_ok, cols, c_ok, ok, H, stride_u, stride_tg,
                   R: tl.constexpr, HAS_TG: tl.constexpr, IEEE: tl.constexpr):
        """silu(g + t_g B_g^T) * (u + t_u B_u^T) in float32 for these columns (g loaded): the arithmetic of
        _silu_mul_kernel and of the split kernel's SILU mode, so both give the same bits."""
        g = g.to(tl.float32)
        u = tl.load(u_ptr + rows[:, None] * stride_u + cols[None, :], mask=ok, other=0.0).to(tl.float32)
        if HAS_TG:
            rr = tl.arange(0, R)
            tg = tl.load(tg_ptr + rows[:, None] * stride_tg + rr[None, :], mask=r_ok[:, None], other=0.0)
            tu = tl.load(tg_ptr + rows[:, None] * stride_tg + R + rr[None, :], mask=r_ok[:, None], other=0.0)
            bg = tl.load(b_ptr + cols[None, :] * R + rr[:, None], mask=c_ok[None, :], other=0.0)         # [R, BK]
            bu = tl.load(b_ptr + (H + cols)[None, :] * R + rr[:, None], mask=c_ok[None, :], other=0.0)
            if IEEE:
                g += tl.dot(tg.to(tl.float32), bg.to(tl.float32), input_precision="ieee")
                u += tl.dot(tu.to(tl.float32), bu.to(tl.float32), input_precision="ieee")
            else:
                g += tl.dot(tg, bg)
                u += tl.dot(tu, bu)
        return g / (1.0 + tl.exp(-g)) * u

    @triton.jit
    def _a_chunk(a_ptr, k0, rc, rc_ok, H, stride_a, BK: tl.constexpr):
        """a^T[k0:k0 + BK] as [BK, RP] (a: [RT, H]; rows >= RT and columns >= H zero)."""
        cols = k0 + tl.arange(0, BK)
        return tl.load(a_ptr + rc[None, :] * stride_a + cols[:, None], mask=(cols < H)[:, None] & rc_ok[None, :],
                       other=0.0)

    @triton.jit
    def _lora_step(acc, k0, at, h_ptr, w_ptr, a_ptr, x_ptr, rows64, r_ok, rstd, rc, rc_ok, H, stride_h, stride_a,
                   stride_x, u_ptr, tg_ptr, b_ptr, stride_u, stride_tg, NORM: tl.constexpr, SILU: tl.constexpr,
                   R: tl.constexpr, HAS_TG: tl.constexpr, BK: tl.constexpr, IEEE: tl.constexpr,
                   LOAD_A: tl.constexpr):
        """acc + x[:, k0:k0 + BK] a^T[k0:k0 + BK]; NORM: x = bf16(h * rstd) * w of these columns, SILU: x = the MLP
        activation of gate h and up u (`_silu_cols`), either written out; else x = h. LOAD_A: the A chunk is loaded
        here, after x is written; else `at` is the chunk, loaded by the caller."""
        cols = k0 + tl.arange(0, BK)
        c_ok = cols < H
        ok = r_ok[:, None] & c_ok[None, :]
        h = tl.load(h_ptr + rows64[:, None] * stride_h + cols[None, :], mask=ok, other=0.0)
        if NORM:
            xn = (h.to(tl.float32) * rstd[:, None]).to(x_ptr.dtype.element_ty).to(tl.float32)
            w = tl.load(w_ptr + cols, mask=c_ok, other=0.0).to(tl.float32)
            x = (xn * w[None, :]).to(x_ptr.dtype.element_ty)
            tl.store(x_ptr + rows64[:, None] * stride_x + cols[None, :], x, mask=ok)
        elif SILU:
            x = _silu_cols(h, u_ptr, tg_ptr, b_ptr, rows64, r_ok, cols, c_ok, ok, H, stride_u, stride_tg, R,
                           HAS_TG, IEEE).to(x_ptr.dtype.element_ty)
            tl.store(x_ptr + rows64[:, None] * stride_x + cols[None, :], x, mask=ok)
        else:
            x = h
        if LOAD_A:
            at = _a_chunk(a_ptr, k0, rc, rc_ok, H, stride_a, BK)
        if IEEE:
            acc += tl.dot(x.to(tl.float32), at.to(tl.float32), input_precision="ieee")
        else:
            acc += tl.dot(x, at.to(x.dtype))
        return acc

    @triton.jit
    def _lora_down_kernel(h_ptr, w_ptr, a_ptr, x_ptr, t_ptr, ws_ptr, cnt_ptr, M, H, RT, stride_h, stride_a, stride_x,
                          stride_t, eps, u_ptr, tg_ptr, b_ptr, stride_u, stride_tg, NORM: tl.constexpr,
                          BM: tl.constexpr, BK: tl.constexpr, ITERS: tl.constexpr, NSPLIT: tl.constexpr,
                          RP: tl.constexpr, BMR: tl.constexpr, RED: tl.constexpr, HP: tl.constexpr, IEEE: tl.constexpr,
                          SILU: tl.constexpr = False, R: tl.constexpr = 16, HAS_TG: tl.constexpr = False,
                          BKS: tl.constexpr = 64):
        """Program (row block of BM, split of ITERS * BK columns): t = x a^T over the split's columns (a: [RT, H], the
        stacked LoRA A factors). NORM: h is the residual stream and x = bf16(h * rstd) * w is computed and written
        (rstd over the whole row, which every split of a row block computes itself: for one row with one whole-row
        load); SILU: h is the gate projection, u_ptr the up projection and x = silu(h + t_g B_g^T) * (u + t_u B_u^T)
        (HAS_TG: with the gate/up LoRA update, t_g | t_u at tg_ptr, B_g over B_u at b_ptr, rank R) is computed and
        written, as silu_mul does; else x = h. Up to 4 steps a program the loop is unrolled (without NORM its A
        chunks loaded first), so its loads are in flight together (a decode step's launch is latency-bound). With
        one split t is written directly; with several the fp32 partials of the row block's BMR real rows are parked
        in ws and its last program to arrive sums them in split order (deterministic; RED partials a load, the loads
        unrolled) and writes t, then resets the row block's arrival counter (as the stream-K GEMMs' tiles do)."""
        pid_m = tl.program_id(0)
        pid_s = tl.program_id(1)
        rows = pid_m * BM + tl.arange(0, BM)
        r_ok = rows < M
        rows64 = rows.to(tl.int64)
        rc = tl.arange(0, RP)
        rc_ok = rc < RT
        k_lo = pid_s * (ITERS * BK)
        # without the norm, the A chunks of the unrolled steps (from HBM) are loaded first, in flight before anything
        # waits (call 44: SiLU + down 8.28 -> 7.42 us, lora_down 4.15 -> 3.93 at 1 row); with it that made the row's
        # load wait (norm + q/k/v 4.88 -> 5.08, norm + gate/up 4.25 -> 4.60), so NORM loads each chunk in its step
        at0 = tl.zeros([BK, RP], dtype=a_ptr.dtype.element_ty)
        at1 = at0
        at2 = at0
        at3 = at0
        if (ITERS <= 4) and (not NORM):
            at0 = _a_chunk(a_ptr, k_lo, rc, rc_ok, H, stride_a, BK)
            if ITERS > 1:
                at1 = _a_chunk(a_ptr, k_lo + BK, rc, rc_ok, H, stride_a, BK)
            if ITERS > 2:
                at2 = _a_chunk(a_ptr, k_lo + 2 * BK, rc, rc_ok, H, stride_a, BK)
            if ITERS > 3:
                at3 = _a_chunk(a_ptr, k_lo + 3 * BK, rc, rc_ok, H, stride_a, BK)
        rstd = tl.zeros([BM], dtype=tl.float32)
        if NORM:
            if BMR == 1:
                hc = tl.arange(0, HP)
                hv = tl.load(h_ptr + (pid_m * BM).to(tl.int64) * stride_h + hc, mask=hc < H, other=0.0).to(tl.float32)
                rstd += 1.0 / tl.sqrt_rn(tl.sum(hv * hv, axis=0) / H + eps)
            else:
                # chunks of [BMR, BKS] (the row block's real rows, 8,192 elements a chunk): each chunk's load waits
                # for the one before (one L2 round trip a chunk), so few wide chunks, not the step's BK (56 round
                # trips at 7B's q/k/v), and no masked rows (BMR < BM only for one row block of M < 16 rows). Call 68
                # (H100, 8 rows, [16, 512] chunks): norm + gate/up 17.05 -> 13.39 us
                rr = pid_m * BM + tl.arange(0, BMR)
                rr_ok = rr < M
                ss = tl.zeros([BMR], dtype=tl.float32)
                for k0 in range(0, H, BKS):
                    cols = k0 + tl.arange(0, BKS)
                    ok = rr_ok[:, None] & (cols < H)[None, :]
                    hv = tl.load(h_ptr + rr.to(tl.int64)[:, None] * stride_h + cols[None, :], mask=ok,
                                 other=0.0).to(tl.float32)
                    ss += tl.sum(hv * hv, axis=1)
                rs = 1.0 / tl.sqrt_rn(ss / H + eps)
                if BMR == BM:
                    rstd = rs
                else:  # row r's rstd into lane r of the row block
                    lr = tl.arange(0, BM)
                    lq = tl.arange(0, BMR)
                    for r in tl.static_range(BMR):
                        rstd = tl.where(lr == r, tl.sum(tl.where(lq == r, rs, 0.0), axis=0), rstd)
        acc = tl.zeros([BM, RP], dtype=tl.float32)
        if ITERS <= 4:
            for i in tl.static_range(ITERS):
                at = at0 if i == 0 else at1 if i == 1 else at2 if i == 2 else at3
                acc = _lora_step(acc, k_lo + i * BK, at, h_ptr, w_ptr, a_ptr, x_ptr, rows64, r_ok, rstd, rc, rc_ok, H,
                                 stride_h, stride_a, stride_x, u_ptr, tg_ptr, b_ptr, stride_u, stride_tg, NORM, SILU,
                                 R, HAS_TG, BK, IEEE, NORM)
        else:
            for k0 in range(k_lo, k_lo + ITERS * BK, BK):
                acc = _lora_step(acc, k0, at0, h_ptr, w_ptr, a_ptr, x_ptr, rows64, r_ok, rstd, rc, rc_ok, H,
                                 stride_h, stride_a, stride_x, u_ptr, tg_ptr, b_ptr, stride_u, stride_tg, NORM, SILU,
                                 R, HAS_TG, BK, IEEE, True)
        if NSPLIT == 1:
            tl.store(t_ptr + rows64[:, None] * stride_t + rc[None, :], acc.to(t_ptr.dtype.element_ty),
                     mask=r_ok[:, None] & rc_ok[None, :])
        else:
            lr = tl.arange(0, BM)
            tl.store(ws_ptr + (pid_m * NSPLIT + pid_s) * (BMR * RP) + lr[:, None] * RP + rc[None, :], acc,
                     mask=(r_ok & (lr < BMR))[:, None])
            # CTA barrier, then a gpu-scope acq_rel arrival (release covers the CTA's stores); the winner reads
            tl.debug_barrier()
            arrived = tl.atomic_add(cnt_ptr + pid_m, 1, sem="acq_rel", scope="gpu")
            if arrived == NSPLIT - 1:
                rr = pid_m * BM + tl.arange(0, BMR)
                rr_ok = rr < M
                tile = tl.arange(0, BMR)[:, None] * RP + rc[None, :]
                tot = tl.zeros([BMR, RP], dtype=tl.float32)
                for p0 in tl.static_range(0, NSPLIT, RED):
                    rp = p0 + tl.arange(0, RED)
                    part = tl.load(ws_ptr + (pid_m * NSPLIT + rp)[:, None, None] * (BMR * RP) + tile[None, :, :],
                                   mask=(rp < NSPLIT)[:, None, None] & rr_ok[None, :, None], other=0.0,
                                   cache_modifier=".cg")
                    tot += tl.sum(part, axis=0)
                tl.store(t_ptr + rr.to(tl.int64)[:, None] * stride_t + rc[None, :], tot.to(t_ptr.dtype.element_ty),
                         mask=rr_ok[:, None] & rc_ok[None, :])
                tl.atomic_xchg(cnt_ptr + pid_m, 0)

    @triton.jit
    def _sample_gumbel_kernel(l_ptr, stride_l, V, inv_t, top_p, seed_ptr, step_ptr, tok_ptr, logp_ptr, ent_ptr, B,
                              BV: tl.constexpr, TOP_P: tl.constexpr, ITERS: tl.constexpr):
        """Program per row: logZ of logits * inv_t (online max and sum); with TOP_P the nucleus (below) and its own
        logZ; then Gumbel-max over log p + g with g from Philox uniforms keyed by (seed + step * B + row, vocabulary
        index), the tokens outside the nucleus at -inf; log p of the winner and the entropy."""
        row = tl.program_id(0)
        base = l_ptr + row.to(tl.int64) * stride_l
        m = tl.full([BV], -float("inf"), dtype=tl.float32)
        lo_v = tl.full([BV], float("inf"), dtype=tl.float32)
        s = tl.zeros([BV], dtype=tl.float32)
        for v0 in range(0, V, BV):
            cols = v0 + tl.arange(0, BV)
            x = tl.load(base + cols, mask=cols < V, other=-float("inf")).to(tl.float32) * inv_t
            m_new = tl.maximum(m, x)
            s = s * tl.exp(tl.where(m_new == -float("inf"), 0.0, m - m_new)) + \
                tl.where(x == -float("inf"), 0.0, tl.exp(x - m_new))
            m = m_new
            lo_v = tl.minimum(lo_v, tl.where(cols < V, x, float("inf")))
        mx = tl.max(m, axis=0)
        logz = mx + tl.log(tl.sum(s * tl.exp(m - mx), axis=0))
        thr = -float("inf")
        if TOP_P:
            # The nucleus: the tokens whose strictly more probable tokens hold at most top_p of the mass (the set
            # torch's top_p_filter keeps, except that tokens tied at the boundary are all kept where the sort keeps
            # the first of them; bfloat16 logits tie often). Its least scaled logit t0 is where
            # S(t) = mass of the tokens above t first drops to <= top_p: bisection keeps S(lo) > top_p >= S(hi), and
            # t0, one of the row's values in (lo, hi], is then the least value above lo
            lo = tl.min(lo_v, axis=0) - 1.0
            hi = mx
            for _ in range(ITERS):
                mid = lo + (hi - lo) * 0.5
                above = tl.zeros([BV], dtype=tl.float32)
                for v0 in range(0, V, BV):
                    cols = v0 + tl.arange(0, BV)
                    x = tl.load(base + cols, mask=cols < V, other=-float("inf")).to(tl.float32) * inv_t
                    above += tl.where(x > mid, tl.exp(x - logz), 0.0)
                inside = tl.sum(above, axis=0) <= top_p
                hi = tl.where(inside, mid, hi)
                lo = tl.where(inside, lo, mid)
            least = tl.full([BV], float("inf"), dtype=tl.float32)
            for v0 in range(0, V, BV):
                cols = v0 + tl.arange(0, BV)
                x = tl.load(base + cols, mask=cols < V, other=-float("inf")).to(tl.float32) * inv_t
                least = tl.minimum(least, tl.where(x > lo, x, float("inf")))
            thr = tl.min(least, axis=0)
            kept = tl.zeros([BV], dtype=tl.float32)
            for v0 in range(0, V, BV):
                cols = v0 + tl.arange(0, BV)
                x = tl.load(base + cols, mask=cols < V, other=-float("inf")).to(tl.float32) * inv_t
                kept += tl.where(x >= thr, tl.exp(x - mx), 0.0)
            logz = mx + tl.log(tl.sum(kept, axis=0))
        key = tl.load(seed_ptr) + tl.load(step_ptr) * B + row
        best = tl.full([BV], -float("inf"), dtype=tl.float32)
        best_i = tl.zeros([BV], dtype=tl.int32)
        ent = tl.zeros([BV], dtype=tl.float32)
        for v0 in range(0, V, BV):
            cols = v0 + tl.arange(0, BV)
            ok = cols < V
            x = tl.load(base + cols, mask=ok, other=-float("inf")).to(tl.float32) * inv_t
            lp = tl.where(x >= thr, x - logz, -float("inf"))
            u = tl.minimum(tl.maximum(tl.rand(key, cols), 1e-20), 1.0)
            score = tl.where(ok, lp - tl.log(-tl.log(u)), -float("inf"))
            better = score > best
            best = tl.where(better, score, best)
            best_i = tl.where(better, cols, best_i)
            p = tl.exp(lp)
            ent += tl.where(ok & (p > 0), -p * lp, 0.0)
        top = tl.max(best, axis=0)
        tok = tl.min(tl.where(best == top, best_i, V), axis=0)  # the first index of the maximum
        lp_tok = tl.load(base + tok).to(tl.float32) * inv_t - logz
        tl.store(tok_ptr + row, tok.to(tl.int64))
        tl.store(logp_ptr + row, lp_tok)
        tl.store(ent_ptr + row, tl.sum(ent, axis=0))

    @triton.jit
    def _half_loads(y_ptr, stride_y, bias_ptr, b_ptr, rows, cols, m_ok, HAS_BIAS: tl.constexpr,
                    HAS_LORA: tl.constexpr, R: tl.constexpr):
        """(base projection columns `cols` of rows `rows` + bias, float32 [BM, D2]; B[cols]^T [R, D2] or 0): the
        loads of one half of a head (bias_ptr and b_ptr already point at the head's first column / row)."""
        y = tl.load(y_ptr + rows[:, None] * stride_y + cols[None, :], mask=m_ok[:, None], other=0.0).to(tl.float32)
        if HAS_BIAS:
            y += tl.load(bias_ptr + cols).to(tl.float32)[None, :]
        bt = 0.0
        if HAS_LORA:
            bt = tl.load(b_ptr + cols[None, :] * R + tl.arange(0, R)[:, None])                     # [R, D2]
        return y, bt

    @triton.jit
    def _lora_add(y, tt, bt, HAS_LORA: tl.constexpr, IEEE: tl.constexpr):
        """y + t B^T for one half (tt [BM, R], bt [R, D2] from `_half_loads`)."""
        if HAS_LORA:
            if IEEE:
                y += tl.dot(tt.to(tl.float32), bt.to(tl.float32), input_precision="ieee")
            else:
                y += tl.dot(tt, bt)
        return y

    @triton.jit
    def _rope_row(y_ptr, stride_y, bias_ptr, t_ptr, stride_t, b_ptr, cos_ptr, sin_ptr, stride_cs, pos_ptr, out_ptr,
                  stride_out, row, t_col, ROPE: tl.constexpr, D: tl.constexpr, HAS_BIAS: tl.constexpr,
                  HAS_LORA: tl.constexpr, R: tl.constexpr):
        """`_rope_head` for one row: the LoRA update as float32 products summed over the rank ([D / 2, R] tiles),
        not a tensor-core product, so no operand passes through shared memory and every load is in flight at once
        (the MMA path converts each loaded tile behind a barrier, one after the other)."""
        D2: tl.constexpr = D // 2
        c = tl.arange(0, D2)
        y1 = tl.load(y_ptr + row * stride_y + c).to(tl.float32)
        y2 = tl.load(y_ptr + row * stride_y + D2 + c).to(tl.float32)
        if HAS_BIAS:
            y1 += tl.load(bias_ptr + c).to(tl.float32)
            y2 += tl.load(bias_ptr + D2 + c).to(tl.float32)
        if HAS_LORA:
            rr = tl.arange(0, R)
            tt = tl.load(t_ptr + row * stride_t + t_col + rr).to(tl.float32)
            b1 = tl.load(b_ptr + c[:, None] * R + rr[None, :]).to(tl.float32)                         # [D2, R]
            b2 = tl.load(b_ptr + (D2 + c)[:, None] * R + rr[None, :]).to(tl.float32)
            y1 += tl.sum(b1 * tt[None, :], axis=1)
            y2 += tl.sum(b2 * tt[None, :], axis=1)
        if ROPE:
            cs = tl.load(pos_ptr + row) * stride_cs
            cos1 = tl.load(cos_ptr + cs + c).to(tl.float32)
            cos2 = tl.load(cos_ptr + cs + D2 + c).to(tl.float32)
            sin1 = tl.load(sin_ptr + cs + c).to(tl.float32)
            sin2 = tl.load(sin_ptr + cs + D2 + c).to(tl.float32)
            o1 = y1 * cos1 - y2 * sin1
            o2 = y2 * cos2 + y1 * sin2
        else:
            o1, o2 = y1, y2
        base = out_ptr + row.to(tl.int64) * stride_out
        tl.store(base + c, o1.to(out_ptr.dtype.element_ty))
        tl.store(base + D2 + c, o2.to(out_ptr.dtype.element_ty))

    @triton.jit
    def _rope_head(y_ptr, stride_y, bias_ptr, t_ptr, stride_t, b_ptr, cos_ptr, sin_ptr, stride_cs, pos_ptr, out_ptr,
                   stride_out, rows, m_ok, t_col, ROPE: tl.constexpr, D: tl.constexpr,
                   HAS_BIAS: tl.constexpr, HAS_LORA: tl.constexpr, R: tl.constexpr, IEEE: tl.constexpr,
                   ONE: tl.constexpr = False):
        """One head (D columns starting at y_ptr / bias_ptr / b_ptr) of rows `rows`: base + bias + LoRA, rotated
        if ROPE, stored at out_ptr + row * stride_out (two halves of D / 2 columns: RoPE pairs column i with
        column i + D / 2). ONE: a single row (`_rope_row`, the batch-1 path; rows[0] is the row)."""
        if ONE:
            _rope_row(y_ptr, stride_y, bias_ptr, t_ptr, stride_t, b_ptr, cos_ptr, sin_ptr, stride_cs, pos_ptr, out_ptr,
                      stride_out, tl.min(rows, axis=0), t_col, ROPE, D, HAS_BIAS, HAS_LORA, R)
            return
        D2: tl.constexpr = D // 2
        c = tl.arange(0, D2)
        if ROPE:
            pos = tl.load(pos_ptr + rows, mask=m_ok, other=0)
            cs = pos[:, None] * stride_cs
            cos1 = tl.load(cos_ptr + cs + c[None, :], mask=m_ok[:, None], other=0.0).to(tl.float32)
            cos2 = tl.load(cos_ptr + cs + D2 + c[None, :], mask=m_ok[:, None], other=0.0).to(tl.float32)
            sin1 = tl.load(sin_ptr + cs + c[None, :], mask=m_ok[:, None], other=0.0).to(tl.float32)
            sin2 = tl.load(sin_ptr + cs + D2 + c[None, :], mask=m_ok[:, None], other=0.0).to(tl.float32)
        y1, b1 = _half_loads(y_ptr, stride_y, bias_ptr, b_ptr, rows, c, m_ok, HAS_BIAS, HAS_LORA, R)
        y2, b2 = _half_loads(y_ptr, stride_y, bias_ptr, b_ptr, rows, c + D2, m_ok, HAS_BIAS, HAS_LORA, R)
        tt = 0.0
        if HAS_LORA:
            tt = tl.load(t_ptr + rows[:, None] * stride_t + t_col + tl.arange(0, R)[None, :], mask=m_ok[:, None],
                         other=0.0)
        x1 = _lora_add(y1, tt, b1, HAS_LORA, IEEE)
        x2 = _lora_add(y2, tt, b2, HAS_LORA, IEEE)
        if ROPE:
            o1 = x1 * cos1 - x2 * sin1
            o2 = x2 * cos2 + x1 * sin2
        else:
            o1, o2 = x1, x2
        base = out_ptr + rows[:, None].to(tl.int64) * stride_out
        tl.store(base + c[None, :], o1.to(out_ptr.dtype.element_ty), mask=m_ok[:, None])
        tl.store(base + D2 + c[None, :], o2.to(out_ptr.dtype.element_ty), mask=m_ok[:, None])

    @triton.jit
    def _qkv_rope_cache_kernel(
            # pointers
            q_ptr, k_ptr, v_ptr, bias_ptr, t_ptr, b_ptr, cos_ptr, sin_ptr, pos_ptr, slot_ptr, kc_ptr, vc_ptr, qo_ptr,
            # sizes
            M, NQ, NK,
            # strides
            stride_q, stride_k, stride_v, stride_t, stride_cs, stride_cb, stride_ch, stride_cs2,
            # meta
            HEADS: tl.constexpr, KVH: tl.constexpr, D: tl.constexpr, BM: tl.constexpr, R: tl.constexpr,
            HAS_BIAS: tl.constexpr, HAS_LORA: tl.constexpr, IEEE: tl.constexpr, ONE: tl.constexpr = False):
        """Program (row block, head j): j < HEADS a query head (rotated, written to qo), j < HEADS + KVH a key head
        (rotated, written to the cache slot), else a value head (written to the cache slot). ONE: one row in all
        (batch 1), without tensor-core products (`_rope_row`)."""
        j = tl.program_id(1)
        rows = tl.program_id(0) * BM + tl.arange(0, BM)
        m_ok = rows < M
        slot = tl.load(slot_ptr)
        if j < HEADS:
            col0 = j * D
            _rope_head(q_ptr + col0, stride_q, bias_ptr + col0, t_ptr, stride_t, b_ptr + col0 * R, cos_ptr, sin_ptr,
                       stride_cs, pos_ptr, qo_ptr + col0, HEADS * D, rows, m_ok, 0, True, D, HAS_BIAS, HAS_LORA,
                       R, IEEE, ONE)
        elif j < HEADS + KVH:
            col0 = (j - HEADS) * D
            _rope_head(k_ptr + col0, stride_k, bias_ptr + NQ + col0, t_ptr, stride_t, b_ptr + (NQ + col0) * R,
                       cos_ptr, sin_ptr, stride_cs, pos_ptr, kc_ptr + (j - HEADS) * stride_ch + slot * stride_cs2,
                       stride_cb, rows, m_ok, R, True, D, HAS_BIAS, HAS_LORA, R, IEEE, ONE)
        else:
            col0 = (j - HEADS - KVH) * D
            _rope_head(v_ptr + col0, stride_v, bias_ptr + NQ + NK + col0, t_ptr, stride_t,
                       b_ptr + (NQ + NK + col0) * R, cos_ptr, sin_ptr, stride_cs, pos_ptr,
                       vc_ptr + (j - HEADS - KVH) * stride_ch + slot * stride_cs2, stride_cb, rows, m_ok,
                       2 * R, False, D, HAS_BIAS, HAS_LORA, R, IEEE, ONE)

    @triton.jit
    def _attn_split_kernel(
            # pointers
            q_ptr, kc_ptr, vc_ptr, valid_ptr, slot_ptr, first_ptr, acc_ptr, ml_ptr, o_ptr,
            # sizes
            SPAN, CHUNK, scale,
            # strides (cache: row, kv head, slot; valid: row)
            stride_cb, stride_ch, stride_cs, stride_valid,
            # meta
            KVH: tl.constexpr, G: tl.constexpr, GP: tl.constexpr, D: tl.constexpr, BS: tl.constexpr,
            NSPLIT: tl.constexpr, IEEE: tl.constexpr, HAS_FIRST: tl.constexpr):
        """Program (row b, kv head h, split s): the G query heads of kv head h against keys [s*CHUNK, (s+1)*CHUNK)
        up to the current slot, from the key block holding the row's first valid slot (HAS_FIRST: the whole blocks
        of left padding before it are not read; masked, they add nothing, so the result is the same bit for bit);
        online softmax; writes the unnormalised partial
        output and (max, sum), or with one split the normalised output itself (no combine kernel)."""
        b = tl.program_id(0)
        h = tl.program_id(1)
        s = tl.program_id(2)
        slot = tl.load(slot_ptr)
        gi = tl.arange(0, GP)
        dd = tl.arange(0, D)
        g_ok = gi < G
        q = tl.load(q_ptr + (b * KVH * G + h * G + gi)[:, None] * D + dd[None, :], mask=g_ok[:, None], other=0.0)
        k0 = s * CHUNK
        k1 = tl.minimum(tl.minimum(k0 + CHUNK, SPAN), slot + 1)
        if HAS_FIRST:
            # whole key blocks before the first valid slot (block boundaries kept: the same sums, bit for bit)
            k0 = tl.maximum(k0, (tl.minimum(tl.load(first_ptr + b), slot) // BS) * BS)
        m_i = tl.full([GP], -1.0e30, dtype=tl.float32)
        l_i = tl.zeros([GP], dtype=tl.float32)
        acc = tl.zeros([GP, D], dtype=tl.float32)
        cache = b.to(tl.int64) * stride_cb + h * stride_ch
        for j0 in range(k0, k1, BS):
            jj = j0 + tl.arange(0, BS)
            j_ok = jj < k1
            kt = tl.load(kc_ptr + cache + jj[:, None] * stride_cs + dd[None, :], mask=j_ok[:, None], other=0.0)
            if IEEE:
                sc = tl.dot(q.to(tl.float32), tl.trans(kt.to(tl.float32)), input_precision="ieee")
            else:
                sc = tl.dot(q, tl.trans(kt))
            ok = tl.load(valid_ptr + b * stride_valid + jj, mask=j_ok, other=0) != 0
            allowed = (ok & (jj < slot)) | (jj == slot)
            sc = tl.where(allowed[None, :], sc * scale, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(sc, axis=1))
            alpha = tl.exp(m_i - m_new)
            p = tl.exp(sc - m_new[:, None])
            l_i = l_i * alpha + tl.sum(p, axis=1)
            vt = tl.load(vc_ptr + cache + jj[:, None] * stride_cs + dd[None, :], mask=j_ok[:, None], other=0.0)
            if IEEE:
                acc = acc * alpha[:, None] + tl.dot(p, vt.to(tl.float32), input_precision="ieee")
            else:
                acc = acc * alpha[:, None] + tl.dot(p.to(vt.dtype), vt)
            m_i = m_new
        if NSPLIT == 1:  # the current slot is always attended: l_i > 0
            o = acc / l_i[:, None]
            tl.store(o_ptr + (b * KVH * G + h * G + gi)[:, None] * D + dd[None, :], o.to(o_ptr.dtype.element_ty),
                     mask=g_ok[:, None])
        else:
            part = (b * KVH + h) * NSPLIT + s
            tl.store(acc_ptr + (part * GP + gi)[:, None] * D + dd[None, :], acc)
            tl.store(ml_ptr + (part * GP + gi) * 2, m_i)
            tl.store(ml_ptr + (part * GP + gi) * 2 + 1, l_i)

    @triton.jit
    def _attn_combine_kernel(acc_ptr, ml_ptr, o_ptr, a_ptr, t_ptr, ws_ptr, cnt_ptr, RT, stride_a, stride_t,
                             KVH: tl.constexpr, G: tl.constexpr, GP: tl.constexpr, D: tl.constexpr,
                             NSPLIT: tl.constexpr, NSP: tl.constexpr, HAS_A: tl.constexpr = False,
                             RP: tl.constexpr = 16, NHP: tl.constexpr = 16):
        """Program (row b, head): o = sum_s exp(m_s - M) acc_s / sum_s exp(m_s - M) l_s. HAS_A: also the LoRA
        down-products of the next projection, t = o a^T (a: [RT, heads * D]): each program's share (its head's
        columns, from o as stored) is parked in ws and the row's last program to arrive sums the shares in head
        order (deterministic), writes t and resets the row's arrival counter, as the split kernel does."""
        b = tl.program_id(0)
        head = tl.program_id(1)
        h = head // G
        gi = head % G
        dd = tl.arange(0, D)
        if HAS_A:  # first: the factors come from HBM, and their latency then overlaps the partials' loads
            rc = tl.arange(0, RP)
            rc_ok = rc < RT
            at = tl.load(a_ptr + rc[:, None] * stride_a + (head * D + dd)[None, :], mask=rc_ok[:, None], other=0.0)
        sp = tl.arange(0, NSP)
        s_ok = sp < NSPLIT
        part = (b * KVH + h) * NSPLIT + sp
        m = tl.load(ml_ptr + (part * GP + gi) * 2, mask=s_ok, other=-1.0e30)
        l_s = tl.load(ml_ptr + (part * GP + gi) * 2 + 1, mask=s_ok, other=0.0)
        w = tl.exp(m - tl.max(m, axis=0))
        acc = tl.load(acc_ptr + (part * GP + gi)[:, None] * D + dd[None, :], mask=s_ok[:, None], other=0.0)
        o = tl.sum(acc * w[:, None], axis=0) / tl.sum(l_s * w, axis=0)
        o = o.to(o_ptr.dtype.element_ty)
        tl.store(o_ptr + (b * KVH * G + head) * D + dd, o)
        if HAS_A:
            HEADS: tl.constexpr = KVH * G
            share = tl.sum(at.to(tl.float32) * o.to(tl.float32)[None, :], axis=1)  # [RP]: exact products
            tl.store(ws_ptr + (b * HEADS + head) * RP + rc, share)
            tl.debug_barrier()  # then one gpu-scope acq_rel arrival (release covers the CTA's stores)
            arrived = tl.atomic_add(cnt_ptr + b, 1, sem="acq_rel", scope="gpu")
            if arrived == HEADS - 1:
                hh = tl.arange(0, NHP)
                shares = tl.load(ws_ptr + (b * HEADS + hh)[:, None] * RP + rc[None, :], mask=(hh < HEADS)[:, None],
                                 other=0.0, cache_modifier=".cg")
                tl.store(t_ptr + b * stride_t + rc, tl.sum(shares, axis=0).to(t_ptr.dtype.element_ty), mask=rc_ok)
                tl.atomic_xchg(cnt_ptr + b, 0)

    @triton.jit
    def _silu_mul_kernel(g_ptr, u_ptr, t_ptr, b_ptr, o_ptr, M, INTER, stride_g, stride_u, stride_t, stride_o,
                         BM: tl.constexpr, BC: tl.constexpr, R: tl.constexpr, HAS_LORA: tl.constexpr,
                         IEEE: tl.constexpr):
        """Program (row block, column block): silu(gate + t_g B_g^T) * (up + t_u B_u^T), float32, rounded once."""
        rows = tl.program_id(0) * BM + tl.arange(0, BM)
        cols = tl.program_id(1) * BC + tl.arange(0, BC)
        r_ok = rows < M
        c_ok = cols < INTER
        ok = r_ok[:, None] & c_ok[None, :]
        g = tl.load(g_ptr + rows[:, None] * stride_g + cols[None, :], mask=ok, other=0.0)
        out = _silu_cols(g, u_ptr, t_ptr, b_ptr, rows, r_ok, cols, c_ok, ok, INTER, stride_u, stride_t, R, HAS_LORA,
                         IEEE)
        tl.store(o_ptr + rows[:, None] * stride_o + cols[None, :], out.to(o_ptr.dtype.element_ty), mask=ok)


def _ieee(t: torch.Tensor) -> bool:
    return t.dtype == torch.float32


def _row_block(m: int) -> int:
    return 16 if m <= 16 else 32 if m <= 32 else 64


# --------------------------------------------------------------------------------------------------------------
# Wrappers
# --------------------------------------------------------------------------------------------------------------
def rmsnorm(h: torch.Tensor, weight: torch.Tensor, eps: float, add: torch.Tensor | None = None, *,
            use_triton: bool = False) -> torch.Tensor:
    """rmsnorm(h [+ add]) * weight for rows h [M, H]; with `add`, h is updated in place to h + add (the residual).

    Raises:
        ValueError: shape mismatch (names the shapes).
    """
    if h.shape[-1] != weight.shape[-1] or (add is not None and add.shape != h.shape):
        raise ValueError(f"rmsnorm: h {tuple(h.shape)}, weight {tuple(weight.shape)}, "
                         f"add {None if add is None else tuple(add.shape)} do not match")
    if not use_triton:
        return rmsnorm_reference(h, weight, eps, add)
    h2 = h.view(-1, h.shape[-1])
    y2 = add.reshape(-1, h.shape[-1]) if add is not None else h2
    out = torch.empty_like(h2)
    hidden = h2.shape[1]
    bh = min(1024, triton.next_power_of_2(hidden))
    _rmsnorm_kernel[(h2.shape[0],)](h2, y2, weight, out, hidden, h2.stride(0), y2.stride(0), out.stride(0),
                                    float(eps), HAS_ADD=add is not None, BH=bh, NB=triton.cdiv(hidden, bh),
                                    num_warps=4)
    return out.view(h.shape)


#: decode rows up to which the engine computes each group's LoRA down-products t = x A^T with the split kernel below
#: (rmsnorm_lora for q/k/v and gate/up, lora_down for o, silu_mul_lora for down), by group; above, the norm kernel
#: (or silu_mul) and cuBLAS, whose skinny product is a split-K GEMV and a reduction, two launches. Per 7B layer on an
#: H100 in CUDA graphs (qerl_kernels.bench_lora; kernels.notes.md call 88, with the norm's sums over the row block's
#: real rows), split vs replaced, us at 1 / 2 / 4 / 8 rows: norm + q/k/v 4.90 / 6.57 / 10.46 / 24.28 vs 7.80-7.83;
#: norm + gate/up 4.27 / 4.55 / 6.45 / 11.42 vs 7.71-7.81; o 3.92 / 3.92 / 4.36 / 4.65 vs 5.68-5.71 (cuBLAS); SiLU +
#: down 7.40 / 8.15 / 9.25 / 12.55 vs 10.76 / 11.00 / 11.07 / 11.99 (silu_mul + lora_down). The cost grows with rows x
#: stacked ranks (ncu, call 76: 220 registers at 8 rows against 77 at 1). At batch <= 65 the 7B step computes o's
#: down-products in the attention combine kernel instead (decode_attention's lora_a). SmolLM2-135M's norm + q/k/v
#: took 7.7-7.9 us against 4.5-4.8 for the norm kernel + cuBLAS at 8-256 rows (one split, call 17)
LORA_SPLIT_MAX_ROWS = {"q/k/v": 2, "o": 8, "gate/up": 4, "down": 4}


def lora_split_max_rows() -> dict[str, int]:
    """{group: rows}: LORA_SPLIT_MAX_ROWS with the entries of the environment's QERL_LORA_SPLIT_ROWS over it
    ("q/k/v=2,down=4": to measure other limits in one process).

    Raises:
        ValueError: an unknown group or a non-integer value in QERL_LORA_SPLIT_ROWS (names it).
    """
    rows = dict(LORA_SPLIT_MAX_ROWS)
    for item in filter(None, os.environ.get("QERL_LORA_SPLIT_ROWS", "").split(",")):
        key, _, val = item.partition("=")
        if key.strip() not in rows or not val.strip().isdigit():
            raise ValueError(f"QERL_LORA_SPLIT_ROWS: bad entry {item!r}; expected GROUP=ROWS with GROUP one of "
                             f"{', '.join(rows)} (e.g. q/k/v=2,down=4)")
        rows[key.strip()] = int(val)
    return rows


#: programs per row block the split kernel aims at (each walks a multiple of lora_block(RT) columns); against 16, per
#: 7B layer at 1 row on an H100 (kernels.notes.md call 15): norm + q/k/v 5.09 vs 5.91 us, o 4.13 vs 4.13, norm +
#: gate/up 4.36 vs 4.80, down 6.13 vs 8.88
LORA_SPLITS = 32


def lora_block(rt: int) -> int:
    """Columns of one step of the split kernel for RT stacked ranks: a [columns, RT] chunk of a^T of ~16 KB (bf16)."""
    rp = max(16, 1 << (max(rt, 1) - 1).bit_length())
    return max(64, min(256, 8192 // rp))


def lora_splits(hidden: int, rt: int, splits: int | None = None) -> tuple[int, int]:
    """(steps per program, programs per row block) of the split kernel for a hidden size and RT stacked ranks: about
    `splits` (default LORA_SPLITS) programs of whole steps of lora_block(rt) columns."""
    n = LORA_SPLITS if splits is None else splits
    if n < 1:
        raise ValueError(f"lora_splits: splits must be >= 1, got {n}")
    bk = lora_block(rt)
    iters = max(1, -(-(-(-hidden // n)) // bk))
    return iters, -(-hidden // (iters * bk))


def _lora_down_launch(h2: torch.Tensor, weight: torch.Tensor | None, a: torch.Tensor, eps: float,
                      splits: int | None, silu: tuple | None = None) -> tuple[torch.Tensor | None, torch.Tensor]:
    """One _lora_down_kernel launch over rows h2 [M, H]: (x, t) with NORM (weight given) or SILU (silu = (up [M, H],
    t_gu [M, 2R] or None, B_gu [2H, R] or None), h2 the gate), (None, t) without either."""
    from qerl_kernels.fp4_launch import _workspace  # the stream-K workspace and counters the GEMMs use too

    m, hidden = h2.shape
    rt = a.shape[0]
    norm = weight is not None
    x = torch.empty_like(h2) if norm or silu is not None else h2
    t = torch.empty(m, rt, dtype=h2.dtype, device=h2.device)
    u2, tg, bgu = silu if silu is not None else (h2, None, None)
    has_tg = tg is not None
    iters, n_split = lora_splits(hidden, rt, splits)
    bm = _row_block(m) if n_split > 1 else 16  # one split: a program per 16 rows (more programs at large M)
    bmr = min(bm, triton.next_power_of_2(m))
    rp = max(16, triton.next_power_of_2(rt))
    row_blocks = triton.cdiv(m, bm)
    ws, cnt = _workspace(h2.device, row_blocks * n_split * bmr * rp, row_blocks)
    red = min(triton.next_power_of_2(n_split), max(1, 4096 // (bmr * rp)))
    _lora_down_kernel[(row_blocks, n_split)](
        h2, weight if norm else a, a, x, t, ws, cnt, m, hidden, rt, h2.stride(0), a.stride(0), x.stride(0),
        t.stride(0), float(eps), u2, tg if has_tg else h2, bgu if has_tg else h2, u2.stride(0),
        tg.stride(0) if has_tg else 0, NORM=norm, BM=bm, BK=lora_block(rt), ITERS=iters, NSPLIT=n_split, RP=rp,
        BMR=bmr, RED=red, HP=triton.next_power_of_2(hidden) if norm else 16,
        BKS=min(triton.next_power_of_2(hidden), max(lora_block(rt), 8192 // bmr)), IEEE=_ieee(h2),
        SILU=silu is not None, R=bgu.shape[1] if has_tg else 16, HAS_TG=has_tg, num_warps=4)
    return (x if norm or silu is not None else None), t


def rmsnorm_lora(h: torch.Tensor, weight: torch.Tensor, eps: float, a: torch.Tensor, *,
                 use_triton: bool = False, splits: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(x, t): x = rmsnorm(h) * weight for rows h [..., H] and t = x a^T [..., RT] (a: [RT, H], the LoRA A factors of
    the projections reading x, stacked), in one kernel; `splits`: programs per row block (default LORA_SPLITS).

    Raises:
        ValueError: shape mismatch (names the shapes).
    """
    if h.shape[-1] != weight.shape[-1] or a.shape[-1] != h.shape[-1]:
        raise ValueError(f"rmsnorm_lora: h {tuple(h.shape)}, weight {tuple(weight.shape)}, a {tuple(a.shape)} do "
                         "not match")
    if not use_triton:
        return rmsnorm_lora_reference(h, weight, eps, a)
    x, t = _lora_down_launch(h.reshape(-1, h.shape[-1]), weight, a, eps, splits)
    return x.view(h.shape), t.view(*h.shape[:-1], a.shape[0])


def lora_down(x: torch.Tensor, a: torch.Tensor, *, use_triton: bool = False,
              splits: int | None = None) -> torch.Tensor:
    """t = x a^T [..., RT] for rows x [..., H] and a [RT, H] (the LoRA A factors of the projections reading x,
    stacked): the split kernel of rmsnorm_lora without the norm, one launch where cuBLAS's skinny GEMM is two
    (its split-K pass and reduction). The reference (use_triton False) is torch.nn.functional.linear.

    Raises:
        ValueError: shape mismatch (names the shapes).
    """
    if a.dim() != 2 or a.shape[-1] != x.shape[-1]:
        raise ValueError(f"lora_down: x {tuple(x.shape)} and a {tuple(a.shape)} do not match (a must be [RT, "
                         f"{x.shape[-1]}])")
    if not use_triton:
        return torch.nn.functional.linear(x, a)
    x2 = x.reshape(-1, x.shape[-1])
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    _, t = _lora_down_launch(x2, None, a, 0.0, splits)
    return t.view(*x.shape[:-1], a.shape[0])


#: True: at batch 1 qkv_rope_cache computes its one row without tensor-core products (`_rope_row`), where the
#: row-block path's operand conversions through shared memory, one loaded tile at a time behind a barrier, chain its
#: loads (SASS: qerl_kernels.decode_compile). On: H100 (issue 22, call 45, `python -m qerl_kernels.bench_rope`, 28
#: 7B-shaped launches as graph replays) 1.85-2.03 us a launch against 2.83 for the row-block path, outputs identical
ROPE_ONE_ROW = True


def qkv_rope_cache(q, k, v, t, lora_b, bias, cos, sin, pos, slot, k_cache, v_cache, *, use_triton: bool = False):
    """Finish the attention projections of one decode step and write the new key/value into the cache.

    Args:
        q, k, v: [B, 1, n_q] / [B, 1, n_kv] base projections (any row strides; last dimension contiguous).
        t: [B, 1, 3 * R] the LoRA down-products x A^T of q, k, v (member i in columns [i R, i R + R)), or None.
        lora_b: [n_q + 2 n_kv, R] the three LoRA up-weights stacked by rows, scaled, zero-padded to R; or None.
        bias: [n_q + 2 n_kv] or None.
        cos, sin: [max_len, d] RoPE tables; pos: [B, 1] positions; slot: [1] the cache slot (a device tensor).
        k_cache, v_cache: [B, kv_heads, max_len, d] one layer's cache (last dimension contiguous).

    Returns:
        [B, 1, heads, d] rotated queries.

    Raises:
        ValueError: T != 1 on the Triton path, or mismatched shapes.
    """
    d = cos.shape[-1]
    if q.shape[-1] % d or k.shape[-1] != v.shape[-1] or k.shape[-1] != k_cache.shape[1] * d:
        raise ValueError(f"qkv_rope_cache: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)} do not fit "
                         f"head_dim {d} and a cache of {tuple(k_cache.shape)}")
    if not use_triton:
        return qkv_rope_cache_reference(q, k, v, t, lora_b, bias, cos, sin, pos, slot, k_cache, v_cache)
    bsz, tt = q.shape[:2]
    if tt != 1:
        raise ValueError(f"qkv_rope_cache: the Triton path writes one token per row, got T = {tt}")
    nq, nk = q.shape[-1], k.shape[-1]
    heads, kvh = nq // d, nk // d
    q2, k2, v2 = q.reshape(bsz, nq), k.reshape(bsz, nk), v.reshape(bsz, nk)
    out = torch.empty(bsz, 1, heads, d, dtype=q.dtype, device=q.device)
    r = lora_b.shape[1] if lora_b is not None else 16
    t2 = t.reshape(bsz, -1) if t is not None else q2
    bm = _row_block(bsz)
    grid = (triton.cdiv(bsz, bm), heads + 2 * kvh)
    _qkv_rope_cache_kernel[grid](
        q2, k2, v2, bias if bias is not None else q2, t2, lora_b if lora_b is not None else q2, cos, sin,
        pos.reshape(-1), slot, k_cache, v_cache, out,
        bsz, nq, nk,
        q2.stride(0), k2.stride(0), v2.stride(0), t2.stride(0), cos.stride(0), k_cache.stride(0),
        k_cache.stride(1), k_cache.stride(2),
        HEADS=heads, KVH=kvh, D=d, BM=bm, R=r, HAS_BIAS=bias is not None, HAS_LORA=t is not None,
        IEEE=_ieee(q), ONE=bsz == 1 and ROPE_ONE_ROW, num_warps=4)
    return out


def attention_splits(batch: int, kv_heads: int, span: int, sms: int = 132, block: int = 64) -> int:
    """Key splits of `decode_attention` for this shape: about two programs an SM (batch x kv_heads x splits), at
    least three splits, at most one key block a split, then as many as the rounded split length needs (no empty
    split); none once batch x kv_heads gives two programs an SM: one kernel instead of a split kernel and a combine
    kernel (the small scale's jobs sharing a GPU are bound by the count of kernels: results/measured/h100/small/
    share_gpu). Measured on the 7B shape (H100, issue 22 calls 78-79, results/measured/h100/kernels/attn_call78/,
    attn_call79/; us a layer with o's LoRA down-products): batch 1 fastest with one block a split (span 1024: 16
    splits 8.3-9.0 against 9.3-10.0 with 8; 2048: 32 splits 10.0 against 10.7 with 16), batch 8 with 8 (2048: 22.3
    against 25.4 with 16), 16 with 4 (22.5 / 34.9 against 25.8 / 39.2 with 8 / 16), 32 and 64 with 3 (35.7 against
    40.1 with 8; 64.5-67.8 with 2-4 at span 1024, 107.2 against 110.4-116.1 with 2-6 at 2048), where the rule before
    (about 8 programs an SM, at least two blocks a split) gave 8, 16, 8 / 16, 8 / 9 and 5. Other GPUs and shapes:
    `python -m qerl_kernels.bench_attention` times every split count beside this rule's."""
    if batch * kv_heads >= 2 * sms:
        return 1
    want = max(-(-2 * sms // max(1, batch * kv_heads)), 3)
    ns = max(1, min(want, span // block, 64))
    chunk = -(-(-(-span // ns)) // block) * block
    return -(-span // chunk)


def decode_attention(q, k_cache, v_cache, valid, slot, span: int, scale: float, *, use_triton: bool = False,
                     splits: int | None = None, first: torch.Tensor | None = None, lora_a: torch.Tensor | None = None):
    """Attention of one query per row and head over the cache slots [0, span) that are valid and <= slot.

    Args:
        q: [B, heads, d] rotated queries; heads = kv_heads * G (query head i uses kv head i // G).
        k_cache, v_cache: [B, kv_heads, max_len, d] one layer's cache (slot `slot` already written).
        valid: [B, max_len] bool, the slots holding real tokens; slot: [1] device tensor; span: keys considered.
        scale: score multiplier (d ** -0.5).
        splits: key splits (default `attention_splits`).
        first: [B] int32, each row's first valid slot (every slot before it invalid: left padding), which the
            kernel then does not read; None reads from slot 0. The result is the same either way.
        lora_a: [RT, heads * d], the next projection's LoRA A factors (o_proj's), or None: with it the combine
            kernel computes their down-products t = out a^T too (one launch where lora_down is another).

    Returns:
        [B, heads * d] in q's dtype; with lora_a (out, t): t [B, RT] in q's dtype where a combine kernel ran (the
        reference: F.linear(out, lora_a)), else None (one split: no combine kernel; the caller computes t).
    """
    if lora_a is not None and (lora_a.dim() != 2 or lora_a.shape[1] != q.shape[1] * q.shape[2]):
        raise ValueError(f"decode_attention: lora_a {tuple(lora_a.shape)} must be [RT, {q.shape[1] * q.shape[2]}]")
    if not use_triton:
        out = decode_attention_reference(q, k_cache, v_cache, valid, slot, span, scale)
        return out if lora_a is None else (out, torch.nn.functional.linear(out, lora_a))
    bsz, heads, d = q.shape
    kvh = k_cache.shape[1]
    g = heads // kvh
    bs = 64 if d <= 128 else 32
    sms = torch.cuda.get_device_properties(q.device).multi_processor_count if q.is_cuda else 2
    ns = splits or attention_splits(bsz, kvh, span, sms, bs)
    chunk = -(-(-(-span // ns)) // bs) * bs
    gp = max(16, triton.next_power_of_2(g))
    out = torch.empty(bsz, heads * d, dtype=q.dtype, device=q.device)
    acc = torch.empty(bsz * kvh * ns * gp * d if ns > 1 else 1, dtype=torch.float32, device=q.device)
    ml = torch.empty(bsz * kvh * ns * gp * 2 if ns > 1 else 1, dtype=torch.float32, device=q.device)
    qc = q.contiguous()
    valid_i8 = valid.view(torch.int8) if valid.dtype == torch.bool else valid
    _attn_split_kernel[(bsz, kvh, ns)](
        qc, k_cache, v_cache, valid_i8, slot, slot if first is None else first, acc, ml, out, span, chunk,
        float(scale), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), valid_i8.stride(0),
        KVH=kvh, G=g, GP=gp, D=d, BS=bs, NSPLIT=ns, IEEE=_ieee(q), HAS_FIRST=first is not None, num_warps=4)
    has_a = lora_a is not None
    if ns == 1:
        return (out, None) if has_a else out
    a, t, ws, cnt, rt, rp = out, out, acc, acc, 0, 16  # without lora_a: placeholders the kernel does not read
    if has_a:
        from qerl_kernels.fp4_launch import _workspace  # the stream-K workspace and counters the GEMMs use too

        a, rt = lora_a, lora_a.shape[0]
        rp = max(16, triton.next_power_of_2(rt))
        t = torch.empty(bsz, rt, dtype=q.dtype, device=q.device)
        ws, cnt = _workspace(q.device, bsz * heads * rp, bsz)
    _attn_combine_kernel[(bsz, heads)](acc, ml, out, a, t, ws, cnt, rt, a.stride(0), t.stride(0), KVH=kvh, G=g,
                                       GP=gp, D=d, NSPLIT=ns, NSP=triton.next_power_of_2(ns), HAS_A=has_a, RP=rp,
                                       NHP=triton.next_power_of_2(heads), num_warps=2)
    return (out, t) if has_a else out


def silu_mul(gate, up, t, lora_b, *, use_triton: bool = False):
    """silu(gate + t_g B_g^T) * (up + t_u B_u^T): the MLP activation with the gate/up LoRA updates folded in.

    Args:
        gate, up: [..., I] base projections (rows may be strided views of one [.., 2I] output).
        t: [..., 2R] LoRA down-products of gate (columns [0, R)) and up ([R, 2R)), or None.
        lora_b: [2I, R] the gate and up LoRA up-weights stacked by rows, scaled, zero-padded to R; or None.

    Returns:
        [..., I] in gate's dtype.
    """
    if gate.shape != up.shape:
        raise ValueError(f"silu_mul: gate {tuple(gate.shape)} and up {tuple(up.shape)} differ")
    if not use_triton:
        return silu_mul_reference(gate, up, t, lora_b)
    inter = gate.shape[-1]
    g2, u2 = gate.reshape(-1, inter), up.reshape(-1, inter)
    m = g2.shape[0]
    out = torch.empty(m, inter, dtype=gate.dtype, device=gate.device)
    r = lora_b.shape[1] if lora_b is not None else 16
    t2 = t.reshape(m, -1) if t is not None else g2
    bm, bc = _row_block(m), 128
    _silu_mul_kernel[(triton.cdiv(m, bm), triton.cdiv(inter, bc))](
        g2, u2, t2, lora_b if lora_b is not None else g2, out, m, inter, g2.stride(0), u2.stride(0), t2.stride(0),
        out.stride(0), BM=bm, BC=bc, R=r, HAS_LORA=t is not None, IEEE=_ieee(gate), num_warps=4)
    return out.view(gate.shape)


#: programs per row block of silu_mul_lora (the split kernel's SILU mode): more than LORA_SPLITS, because each
#: program also reads its columns' gate/up LoRA up-weights (B_g, B_u: 4 R bytes a column) beside its chunk of A. Per
#: 7B layer at 1 row on an H100 (kernels.notes.md call 34): 8.31 us at 128, 12.20 at 64, 16.62 at 32, against 10.78
#: for silu_mul + lora_down
SILU_LORA_SPLITS = 128


def silu_mul_lora(gate, up, t, lora_b, a, *, use_triton: bool = False, splits: int | None = None):
    """(m, t_d): m = silu_mul(gate, up, t, lora_b) and t_d = m a^T (a: [RT, I], the down projection's LoRA A), in
    one launch of the split kernel (SILU mode) where silu_mul and lora_down are two; `splits`: programs per row
    block (default SILU_LORA_SPLITS). The reference: silu_mul_reference, then torch.nn.functional.linear.

    Raises:
        ValueError: shape mismatch (names the shapes).
    """
    if gate.shape != up.shape or a.dim() != 2 or a.shape[-1] != gate.shape[-1]:
        raise ValueError(f"silu_mul_lora: gate {tuple(gate.shape)}, up {tuple(up.shape)}, a {tuple(a.shape)} do not "
                         f"match (a must be [RT, {gate.shape[-1]}])")
    if not use_triton:
        m = silu_mul_reference(gate, up, t, lora_b)
        return m, torch.nn.functional.linear(m, a)
    inter = gate.shape[-1]
    g2, u2 = gate.reshape(-1, inter), up.reshape(-1, inter)
    t2 = t.reshape(g2.shape[0], -1) if t is not None else None
    m, td = _lora_down_launch(g2, None, a, 0.0, SILU_LORA_SPLITS if splits is None else splits,
                              silu=(u2, t2, lora_b if t is not None else None))
    return m.view(gate.shape), td.view(*gate.shape[:-1], a.shape[0])


def sample_gumbel_pays(batch: int, vocab: int, top_p: float = 1.0) -> bool:
    """Whether `sample_gumbel` (one program per row) beats torch's ops for [batch, vocab] logits, as measured on an H100
    inside CUDA graphs (results/measured/h100/small/sampler/; `python -m qerl.profiling.sampler_bench`), us fused vs
    torch. Without top-p: vocabulary 152,064 (Qwen2.5): 1 row 139-147 vs 82-84, 8 rows 142-146 vs 109-118, 64 rows
    143-148 vs 518-520, 256 rows 259-268 vs 1,888; vocabulary 49,152 (SmolLM2): 1 row 47-50 vs 60-61, 16 rows 48-50 vs
    76-78, 128 rows 48-50 vs 282-283. With top-p 0.95 (the nucleus costs 34 more passes over each row; torch sorts the
    row): 152,064: 1 row 628 vs 192, 8 rows 635 vs 524, 64 rows 646 vs 1,905, 256 rows 1,316 vs 6,792; 49,152: 1 row
    169 vs 138, 16 rows 169 vs 302, 128 rows 170 vs 1,287. A few rows leave the GPU to a few programs."""
    return batch >= 16 or (top_p >= 1.0 and vocab <= 65536)


def sample_gumbel(logits: torch.Tensor, temperature: float, seed: torch.Tensor, step: torch.Tensor,
                  top_p: float = 1.0):
    """One token per row of softmax(logits / temperature), within the nucleus of mass `top_p` (Gumbel-max; the
    distribution of qerl.rl.sampling's gumbel_sample, other draws): (tokens [B] long, their log-probs [B] float32, the
    sampled distribution's entropy in nats [B] float32). The uniforms come from Philox keyed by (seed + step * B + row,
    token): device tensors `seed` [1] int64 and `step` [1] long, read at run time (a CUDA graph replaying the call
    draws anew as `step` advances); Triton only (GPU, or the CPU interpreter). With top_p < 1 the nucleus is found
    without sorting: 32 bisection passes over the row's scaled logits for the least one inside, then the least value
    above the bisection's lower end (exact unless two of the row's values lie within its final interval).

    Raises:
        ValueError: temperature <= 0 (greedy decoding takes the argmax: qerl.rl.sampling.gumbel_sample), or top_p
            outside (0, 1].
    """
    if temperature <= 0:
        raise ValueError(f"sample_gumbel samples at a temperature > 0, got {temperature}")
    bsz, vocab = logits.shape
    tok = torch.empty(bsz, dtype=torch.long, device=logits.device)
    logp = torch.empty(bsz, dtype=torch.float32, device=logits.device)
    ent = torch.empty(bsz, dtype=torch.float32, device=logits.device)
    if not 0 < top_p <= 1:
        raise ValueError(f"sample_gumbel: top_p must be in (0, 1], got {top_p}")
    _sample_gumbel_kernel[(bsz,)](logits, logits.stride(0), vocab, 1.0 / float(temperature), float(top_p), seed, step,
                                  tok, logp, ent, bsz, BV=min(4096, triton.next_power_of_2(vocab)),
                                  TOP_P=top_p < 1.0, ITERS=32, num_warps=8)
    return tok, logp, ent
