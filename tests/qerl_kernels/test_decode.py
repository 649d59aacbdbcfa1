"""The decode-step kernels (qerl_kernels/decode.py) against their torch references: RMSNorm with the residual add, q/k/v
LoRA + bias + RoPE + cache write, split-K decode attention (GQA, masked slots, several splits) and SiLU-mul with the
gate/up LoRA updates. CPU: TRITON_INTERPRET=1 (float32, tiny shapes); GPU: bf16 as well."""
from __future__ import annotations

import pytest
import torch

from qerl_kernels import decode
from qerl_kernels.reference import rel_error

pytestmark = pytest.mark.triton_device

DEV = "cuda" if torch.cuda.is_available() else "cpu"
DTYPES = [torch.float32] + ([torch.bfloat16] if DEV == "cuda" else [])


def _tol(dtype):
    return 1e-5 if dtype == torch.float32 else 1e-2


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("add", [False, True], ids=["norm", "add+norm"])
def test_rmsnorm(dtype, add):
    g = torch.Generator().manual_seed(0)
    h = torch.randn(3, 96, generator=g).to(DEV, dtype)
    w = (1 + 0.1 * torch.randn(96, generator=g)).to(DEV, dtype)
    y = torch.randn(3, 96, generator=g).to(DEV, dtype) if add else None
    h_ref = h.clone()
    ref = decode.rmsnorm(h_ref, w, 1e-6, y)
    out = decode.rmsnorm(h, w, 1e-6, y, use_triton=True)
    assert torch.equal(h, h_ref)  # the residual sum, written back, is identical
    assert rel_error(out, ref) < _tol(dtype)


def _qkv_inputs(dtype, bsz=3, heads=4, kvh=2, d=32, r=16, max_len=24, lora=True, bias=True, seed=0):
    g = torch.Generator().manual_seed(seed)

    def rn(*s):
        return torch.randn(*s, generator=g).to(DEV, dtype)

    nq, nk = heads * d, kvh * d
    y = rn(bsz, 1, nq + 2 * nk)
    q, k, v = y[..., :nq], y[..., nq:nq + nk], y[..., nq + nk:]  # strided views, as the engine passes them
    t = rn(bsz, 1, 3 * r) if lora else None
    lora_b = 0.3 * rn(nq + 2 * nk, r) if lora else None
    b = rn(nq + 2 * nk) if bias else None
    ang = torch.arange(max_len)[:, None] * torch.rand(d // 2, generator=g)[None, :]
    cos = torch.cat([ang.cos(), ang.cos()], -1).to(DEV, dtype)
    sin = torch.cat([ang.sin(), ang.sin()], -1).to(DEV, dtype)
    pos = torch.tensor([[5], [0], [17]], device=DEV)[:bsz]
    slot = torch.tensor([9], device=DEV)
    kc = rn(bsz, kvh, max_len, d)
    vc = rn(bsz, kvh, max_len, d)
    return q, k, v, t, lora_b, b, cos, sin, pos, slot, kc, vc


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("lora,bias,bsz,one_row", [(True, True, 3, True), (False, True, 3, True),
                                                   (True, False, 3, True), (True, True, 1, True),
                                                   (False, True, 1, True), (True, True, 1, False)],
                         ids=["lora+bias", "bias", "lora", "one-row", "one-row-bias", "one-row-mma"])
def test_qkv_rope_cache(dtype, lora, bias, bsz, one_row, monkeypatch):
    """Three rows (tensor-core LoRA products over a row block) and one (decode.ROPE_ONE_ROW: float32 products summed
    over the rank; or the row-block path, False) give the reference's queries and cache writes."""
    monkeypatch.setattr(decode, "ROPE_ONE_ROW", one_row)
    args = _qkv_inputs(dtype, bsz=bsz, lora=lora, bias=bias)
    ref_kc, ref_vc = args[10].clone(), args[11].clone()
    ref = decode.qkv_rope_cache(*args[:10], ref_kc, ref_vc)
    kc, vc = args[10].clone(), args[11].clone()
    out = decode.qkv_rope_cache(*args[:10], kc, vc, use_triton=True)
    assert out.shape == ref.shape == (bsz, 1, 4, 32)
    assert rel_error(out, ref) < _tol(dtype)
    assert rel_error(kc, ref_kc) < _tol(dtype) and rel_error(vc, ref_vc) < _tol(dtype)
    others = torch.ones(kc.shape[2], dtype=torch.bool)
    others[9] = False
    assert torch.equal(kc[:, :, others], args[10][:, :, others])  # only slot 9 was written


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("splits", [1, 3], ids=["one-split", "three-splits"])
@pytest.mark.parametrize("slot", [0, 37, 70], ids=lambda s: f"slot{s}")
def test_decode_attention(dtype, splits, slot):
    g = torch.Generator().manual_seed(slot)
    bsz, kvh, grp, d, max_len, span = 2, 2, 3, 32, 80, 72
    q = torch.randn(bsz, kvh * grp, d, generator=g).to(DEV, dtype)
    kc = torch.randn(bsz, kvh, max_len, d, generator=g).to(DEV, dtype)
    vc = torch.randn(bsz, kvh, max_len, d, generator=g).to(DEV, dtype)
    valid = torch.rand(bsz, max_len, generator=g).to(DEV) > 0.3
    valid[1, :20] = False  # left padding of row 1
    s = torch.tensor([slot], device=DEV)
    ref = decode.decode_attention(q, kc, vc, valid, s, span, d ** -0.5)
    out = decode.decode_attention(q, kc, vc, valid, s, span, d ** -0.5, use_triton=True, splits=splits)
    assert out.shape == (bsz, kvh * grp * d)
    assert rel_error(out, ref) < _tol(dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("bsz,rt,splits", [(1, 32, 3), (3, 20, 2), (2, 16, 1)],
                         ids=["one-row", "ragged-rank", "one-split"])
def test_decode_attention_with_the_next_lora_down_products(dtype, bsz, rt, splits):
    """With o's LoRA A factors the combine kernel also gives t = out a^T (the heads' shares summed by the row's last
    program): the same output as without, t as lora_down gives it, the same bits twice (the arrival counters reset
    themselves); with one split there is no combine kernel and t is left to the caller (None)."""
    g = torch.Generator().manual_seed(bsz + rt)
    kvh, grp, d, max_len, span = 2, 3, 32, 80, 72
    q = torch.randn(bsz, kvh * grp, d, generator=g).to(DEV, dtype)
    kc = torch.randn(bsz, kvh, max_len, d, generator=g).to(DEV, dtype)
    vc = torch.randn(bsz, kvh, max_len, d, generator=g).to(DEV, dtype)
    valid = torch.rand(bsz, max_len, generator=g).to(DEV) > 0.3
    a = (0.2 * torch.randn(rt, kvh * grp * d, generator=g)).to(DEV, dtype)
    s = torch.tensor([50], device=DEV)
    kw = dict(use_triton=True, splits=splits)
    plain = decode.decode_attention(q, kc, vc, valid, s, span, d ** -0.5, **kw)
    out, t = decode.decode_attention(q, kc, vc, valid, s, span, d ** -0.5, lora_a=a, **kw)
    assert torch.equal(out, plain)
    if splits == 1:
        assert t is None
    else:
        assert t.shape == (bsz, rt) and rel_error(t, torch.nn.functional.linear(out, a)) < _tol(dtype)
        out2, t2 = decode.decode_attention(q, kc, vc, valid, s, span, d ** -0.5, lora_a=a, **kw)
        assert torch.equal(out2, out) and torch.equal(t2, t)
    ref, ref_t = decode.decode_attention(q, kc, vc, valid, s, span, d ** -0.5, lora_a=a)
    assert rel_error(out, ref) < _tol(dtype) and torch.equal(ref_t, torch.nn.functional.linear(ref, a))
    with pytest.raises(ValueError, match="lora_a"):
        decode.decode_attention(q, kc, vc, valid, s, span, d ** -0.5, lora_a=a[:, 1:], **kw)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("splits", [1, 2], ids=["one-split", "two-splits"])
def test_decode_attention_skips_left_padding_blocks(dtype, splits):
    """Given each row's first valid slot, the kernel leaves out the whole key blocks of left padding before it: the
    same output bit for bit (and the reference's); a first slot past the current one still attends that slot."""
    g = torch.Generator().manual_seed(11)
    bsz, kvh, grp, d, max_len, span = 3, 2, 2, 32, 300, 256
    q = torch.randn(bsz, kvh * grp, d, generator=g).to(DEV, dtype)
    kc = torch.randn(bsz, kvh, max_len, d, generator=g).to(DEV, dtype)
    vc = torch.randn(bsz, kvh, max_len, d, generator=g).to(DEV, dtype)
    valid = torch.ones(bsz, max_len, dtype=torch.bool, device=DEV)
    valid[0, :130] = False
    valid[1, :200] = False
    s = torch.tensor([250], device=DEV)
    valid[2, :] = False  # row 2: nothing valid before the current slot, its first slot given past it
    first = torch.tensor([130, 200, 299], dtype=torch.int32, device=DEV)
    out = decode.decode_attention(q, kc, vc, valid, s, span, d ** -0.5, use_triton=True, splits=splits, first=first)
    whole = decode.decode_attention(q, kc, vc, valid, s, span, d ** -0.5, use_triton=True, splits=splits)
    assert torch.equal(out, whole)
    assert rel_error(out, decode.decode_attention(q, kc, vc, valid, s, span, d ** -0.5)) < _tol(dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("lora", [True, False], ids=["lora", "plain"])
def test_silu_mul(dtype, lora):
    g = torch.Generator().manual_seed(1)
    inter, r = 200, 16
    y = torch.randn(3, 1, 2 * inter, generator=g).to(DEV, dtype)
    t = torch.randn(3, 1, 2 * r, generator=g).to(DEV, dtype) if lora else None
    lb = (0.3 * torch.randn(2 * inter, r, generator=g)).to(DEV, dtype) if lora else None
    ref = decode.silu_mul(y[..., :inter], y[..., inter:], t, lb)
    out = decode.silu_mul(y[..., :inter], y[..., inter:], t, lb, use_triton=True)
    assert out.shape == (3, 1, inter)
    assert rel_error(out, ref) < _tol(dtype)


def test_rank_padding_and_splits():
    assert [decode.lora_rank_pad(r) for r in (1, 8, 16, 17, 32, 64)] == [16, 16, 16, 32, 32, 64]
    # about two programs an SM, at least three splits, at most one key block a split, no empty split (H100 calls
    # 78-79: batch 1 fastest with one block a split, 8 with 8 splits, 16 with 4, 32 and 64 with 3)
    assert decode.attention_splits(1, 4, 2304) == 36
    assert decode.attention_splits(1, 4, 1024) == 16 and decode.attention_splits(8, 4, 1024) == 8
    assert decode.attention_splits(8, 4, 2048) == 8   # 9 wanted, 256-key splits: 8 of them
    assert decode.attention_splits(16, 4, 1024) == 4 and decode.attention_splits(64, 4, 1024) == 3
    assert decode.attention_splits(512, 4, 2304) == 1  # a large batch fills the GPU by itself
    assert decode.attention_splits(128, 3, 512) == 1  # the small scale's rollouts: no combine kernel
    assert decode.attention_splits(64, 4, 512) == 3
    # the fused sampler where the H100 measured it faster (results/measured/h100/small/sampler)
    assert decode.sample_gumbel_pays(128, 49152) and decode.sample_gumbel_pays(1, 49152)
    assert decode.sample_gumbel_pays(64, 152064) and not decode.sample_gumbel_pays(8, 152064)
    # top-p 0.95 (the evaluations): from 16 rows at either vocabulary, never at 1-8 rows
    assert decode.sample_gumbel_pays(16, 49152, top_p=0.95) and decode.sample_gumbel_pays(64, 152064, top_p=0.95)
    assert not decode.sample_gumbel_pays(1, 49152, top_p=0.95) and not decode.sample_gumbel_pays(8, 152064, top_p=0.95)
    assert decode.attention_splits(1, 4, 64) == 1


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("rows,hidden,rt,splits", [(3, 200, 48, None), (20, 64, 96, None), (1, 130, 16, None),
                                                   (3, 200, 48, 1), (20, 320, 96, 3), (70, 600, 16, 2),
                                                   (8, 1100, 16, None)],
                         ids=["ragged", "two-programs", "one-row", "one-split", "three-splits", "two-row-blocks",
                              "eight-rows-two-chunks"])
def test_rmsnorm_lora(dtype, rows, hidden, rt, splits):
    """The norm and the LoRA down-products in one kernel equal the norm kernel's output and x a^T, with the hidden
    size split over one or several programs (their partials summed by the last to arrive)."""
    g = torch.Generator().manual_seed(rows)
    h = torch.randn(rows, 1, hidden, generator=g).to(DEV, dtype)
    w = (1 + 0.1 * torch.randn(hidden, generator=g)).to(DEV, dtype)
    a = (0.2 * torch.randn(rt, hidden, generator=g)).to(DEV, dtype)
    ref_x, ref_t = decode.rmsnorm_lora(h, w, 1e-6, a)
    x, t = decode.rmsnorm_lora(h, w, 1e-6, a, use_triton=True, splits=splits)
    assert x.shape == h.shape and t.shape == (rows, 1, rt)
    assert rel_error(x, ref_x) < _tol(dtype) and rel_error(t, ref_t) < _tol(dtype)
    assert rel_error(x, decode.rmsnorm(h, w, 1e-6, use_triton=True)) < _tol(dtype)
    with pytest.raises(ValueError, match="rmsnorm_lora"):
        decode.rmsnorm_lora(h, w, 1e-6, a[:, 1:])


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("rows,hidden,rt,splits", [(1, 448, 32, None), (5, 320, 96, 4), (33, 700, 16, 2)],
                         ids=["one-row", "ragged-rank", "ragged-hidden"])
def test_lora_down(dtype, rows, hidden, rt, splits):
    """The split kernel without the norm equals x a^T; run twice, it gives the same bits (the partials are summed
    in split order and the arrival counters reset themselves)."""
    g = torch.Generator().manual_seed(hidden)
    x = torch.randn(rows, hidden, generator=g).to(DEV, dtype)
    a = (0.2 * torch.randn(rt, hidden, generator=g)).to(DEV, dtype)
    t = decode.lora_down(x, a, use_triton=True, splits=splits)
    assert t.shape == (rows, rt) and rel_error(t, decode.lora_down(x, a)) < _tol(dtype)
    assert torch.equal(decode.lora_down(x, a, use_triton=True, splits=splits), t)
    with pytest.raises(ValueError, match="lora_down"):
        decode.lora_down(x, a[:, 1:])


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("rows,inter,rt,lora,splits", [(1, 600, 32, True, None), (1, 200, 16, False, None),
                                                       (3, 330, 32, True, 3), (1, 600, 32, True, 1)],
                         ids=["one-row", "no-gate-up-lora", "ragged-rows", "one-split"])
def test_silu_mul_lora(dtype, rows, inter, rt, lora, splits):
    """The MLP activation and the down projection's LoRA down-product in one kernel equal silu_mul's output (the same
    bits on a GPU) and m a^T (summed over other splits than lora_down's); run twice, the same bits."""
    g = torch.Generator().manual_seed(inter + rows)
    r = 16
    y = torch.randn(rows, 1, 2 * inter, generator=g).to(DEV, dtype)  # gate and up as views of one output
    t = torch.randn(rows, 1, 2 * r, generator=g).to(DEV, dtype) if lora else None
    lb = (0.3 * torch.randn(2 * inter, r, generator=g)).to(DEV, dtype) if lora else None
    a = (0.2 * torch.randn(rt, inter, generator=g)).to(DEV, dtype)
    gate, up = y[..., :inter], y[..., inter:]
    ref_m, ref_t = decode.silu_mul_lora(gate, up, t, lb, a)
    m, td = decode.silu_mul_lora(gate, up, t, lb, a, use_triton=True, splits=splits)
    assert m.shape == (rows, 1, inter) and td.shape == (rows, 1, rt)
    assert rel_error(m, ref_m) < _tol(dtype) and rel_error(td, ref_t) < _tol(dtype)
    if DEV == "cuda":  # the interpreter's float32 dots may round differently from the two-kernel path
        assert torch.equal(m, decode.silu_mul(gate, up, t, lb, use_triton=True))
    m2, td2 = decode.silu_mul_lora(gate, up, t, lb, a, use_triton=True, splits=splits)
    assert torch.equal(m2, m) and torch.equal(td2, td)
    with pytest.raises(ValueError, match="silu_mul_lora"):
        decode.silu_mul_lora(gate, up, t, lb, a[:, 1:])


def test_lora_splits():
    """Programs of whole steps of lora_block(RT) columns (a^T chunks of ~16 KB) covering the hidden size, about
    LORA_SPLITS of them."""
    assert [decode.lora_block(rt) for rt in (16, 32, 64, 96, 128)] == [256, 256, 128, 64, 64]
    assert decode.lora_splits(3584, 96) == (2, 28) and decode.lora_splits(18944, 32) == (3, 25)
    assert decode.lora_splits(576, 96) == (1, 9) and decode.lora_splits(100, 16, 1) == (1, 1)
    for hidden in (1, 63, 64, 65, 3584, 18944):
        for rt in (16, 96):
            iters, n = decode.lora_splits(hidden, rt)
            cols = iters * decode.lora_block(rt)
            assert (n - 1) * cols < hidden <= n * cols and n <= decode.LORA_SPLITS
    with pytest.raises(ValueError, match="splits"):
        decode.lora_splits(64, 16, 0)


@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_sample_gumbel_logp_entropy_determinism(temperature):
    """The fused sampler's log-probs and entropies are those of softmax(logits / T) for the tokens it drew; the same
    seed and step draw the same tokens, another step others."""
    g = torch.Generator().manual_seed(3)
    logits = (3 * torch.randn(6, 300, generator=g)).to(DEV, torch.bfloat16)
    seed = torch.tensor([12345], dtype=torch.int64, device=DEV)
    step = torch.tensor([7], device=DEV)
    tok, logp, ent = decode.sample_gumbel(logits, temperature, seed, step)
    ref = torch.log_softmax(logits.float() / temperature, -1)
    assert torch.allclose(logp, ref.gather(1, tok[:, None])[:, 0], atol=1e-5)
    assert torch.allclose(ent, -(ref.exp() * ref).sum(-1), atol=1e-4)
    assert torch.equal(tok, decode.sample_gumbel(logits, temperature, seed, step)[0])
    draws = torch.stack([decode.sample_gumbel(logits, temperature, seed, torch.tensor([k], device=DEV))[0]
                         for k in range(8)])
    assert (draws != draws[0]).any()
    with pytest.raises(ValueError, match="temperature"):
        decode.sample_gumbel(logits, 0.0, seed, step)


def test_sample_gumbel_follows_the_distribution():
    """Frequencies over 256 rows of the same logits match softmax(logits / T) (the Gumbel-max law)."""
    logits = torch.tensor([2.0, 1.0, 0.0, -1.0, 0.5, 3.0, -2.0, 1.5], device=DEV).repeat(256, 1)
    tok, _, _ = decode.sample_gumbel(logits, 0.8, torch.tensor([99], dtype=torch.int64, device=DEV),
                                     torch.tensor([0], device=DEV))
    freq = torch.bincount(tok.cpu(), minlength=8).float() / 256
    p = torch.softmax(logits[0].cpu() / 0.8, -1)
    assert (freq - p).abs().max() < 0.095, (freq, p)  # 3 standard deviations at 256 rows


@pytest.mark.parametrize("top_p", [0.95, 0.6])
def test_sample_gumbel_top_p_keeps_torchs_nucleus(top_p):
    """With top_p < 1 the fused sampler draws inside the nucleus (the tokens whose strictly more probable tokens hold
    at most top_p: torch's top_p_filter's set, except that tokens tied at its boundary are all kept where the sort
    keeps the first), with that filtered distribution's log-probs and entropy, and follows its law."""
    from qerl.rl.sampling import top_p_filter

    def nucleus_logp(x):
        p = torch.softmax(x, -1)
        above = ((x[:, None, :] > x[:, :, None]) * p[:, None, :]).sum(-1)  # mass strictly above each token
        return torch.log_softmax(x.masked_fill(above > top_p, float("-inf")), -1)

    g = torch.Generator().manual_seed(4)
    logits = (2 * torch.randn(5, 300, generator=g)).to(DEV, torch.bfloat16)
    seed = torch.tensor([7], dtype=torch.int64, device=DEV)
    ref = nucleus_logp(logits.float() / 0.6)
    sorted_ref = torch.log_softmax(top_p_filter(logits.float() / 0.6, top_p), -1)
    assert (torch.isfinite(ref) != torch.isfinite(sorted_ref)).sum() <= 2  # ties at the boundary only
    for k in range(2):
        tok, logp, ent = decode.sample_gumbel(logits, 0.6, seed, torch.tensor([k], device=DEV), top_p=top_p)
        assert torch.isfinite(ref.gather(1, tok[:, None])).all()  # inside the nucleus
        assert torch.allclose(logp, ref.gather(1, tok[:, None])[:, 0], atol=1e-5)
        p = ref.exp()
        assert torch.allclose(ent, -(p * ref.masked_fill(p == 0, 0.0)).sum(-1), atol=1e-4)
    if top_p == 0.6:  # the law, once (the interpreter runs a program per row)
        small = torch.tensor([2.0, 1.0, 0.0, -1.0, 0.5, 3.0, -2.0, 1.5], device=DEV).repeat(64, 1)
        tok, _, _ = decode.sample_gumbel(small, 1.0, seed, torch.tensor([0], device=DEV), top_p=top_p)
        freq = torch.bincount(tok.cpu(), minlength=8).float() / 64
        law = torch.softmax(top_p_filter(small[:1].cpu(), top_p), -1)[0]  # no ties here
        assert (freq - law).abs().max() < 0.19, (freq, law)  # 3 standard deviations at 64 rows
        assert freq[law == 0].sum() == 0
    with pytest.raises(ValueError, match="top_p"):
        decode.sample_gumbel(logits, 0.6, seed, torch.tensor([0], device=DEV), top_p=0.0)
