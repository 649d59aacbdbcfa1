"""The in-kernel L2 prefetch of the decode step (qerl_kernels.l2_prefetch): what the kernels are told to prefetch
(lines per region, at most two contiguous regions, nothing off CUDA), which of an engine's groups qualify
(Group.l2_regions: weights that fit in L2_FRACTION of the L2), and on a GPU that a prefetching kernel gives the same
bits as the same kernel without it (prefetch only moves lines into L2)."""
from __future__ import annotations

import pytest
import torch

from qerl_kernels import decode
from qerl_kernels.l2_prefetch import kernel_args, prefetch_lines

CUDA = torch.cuda.is_available()


def test_prefetch_lines_counts_128_byte_lines_and_rejects_what_a_kernel_cannot_take():
    a = torch.empty(1000, dtype=torch.int32)       # 4000 bytes: 31.25 lines
    b = torch.empty(3, 128, dtype=torch.bfloat16)  # 768 bytes: 6 lines
    assert prefetch_lines((a, b)) == [32, 6] and prefetch_lines(()) == [] and prefetch_lines(None) == []
    with pytest.raises(ValueError, match="at most two"):
        prefetch_lines((a, a, a))
    with pytest.raises(ValueError, match="region 1 .* not contiguous"):
        prefetch_lines((a, b.t()))


def test_kernel_args_prefetch_nothing_off_cuda_or_without_regions():
    x = torch.empty(4)
    args = kernel_args((torch.empty(300, dtype=torch.int32),), x)
    assert args[-1] is False and args[1] == 0 and args[3] == 0  # the interpreter runs no PTX
    assert kernel_args((), x)[-1] is False


def test_groups_offer_their_weights_only_on_cuda():
    from qerl.profiling.build import build_random_model
    from qerl.rl.engine import DecodeEngine
    model = build_random_model("0.5B", "qerl", rank=4, layers=1, device="cpu")
    eng = DecodeEngine(model, batch=1, max_len=16, kernels="torch")
    assert not eng.l2_prefetch and all(g.l2_regions == () for g in eng._groups[0])
    assert eng._prefetch(eng._groups[0][1], True) == ()


@pytest.mark.skipif(not CUDA, reason="PTX prefetch needs a GPU")
def test_prefetching_kernels_give_the_same_bits():
    g = torch.Generator(device="cuda").manual_seed(0)
    bf = torch.bfloat16
    region = (torch.randint(0, 2**30, (4096, 448), device="cuda", dtype=torch.int32, generator=g),
              torch.randn(4096, 112, device="cuda", generator=g).to(bf))
    h = torch.randn(1, 1, 3584, device="cuda", generator=g).to(bf)
    w = (1 + 0.1 * torch.randn(3584, device="cuda", generator=g)).to(bf)
    a = (0.2 * torch.randn(96, 3584, device="cuda", generator=g)).to(bf)
    x0, t0 = decode.rmsnorm_lora(h, w, 1e-6, a, use_triton=True)
    x1, t1 = decode.rmsnorm_lora(h, w, 1e-6, a, use_triton=True, prefetch=region)
    assert torch.equal(x0, x1) and torch.equal(t0, t1)
    y = torch.randn(1, 1, 2 * 4096, device="cuda", generator=g).to(bf)
    tt = torch.randn(1, 1, 64, device="cuda", generator=g).to(bf)
    lb = (0.3 * torch.randn(2 * 4096, 32, device="cuda", generator=g)).to(bf)
    ad = (0.2 * torch.randn(32, 4096, device="cuda", generator=g)).to(bf)
    m0 = decode.silu_mul_lora(y[..., :4096], y[..., 4096:], tt, lb, ad, use_triton=True)
    m1 = decode.silu_mul_lora(y[..., :4096], y[..., 4096:], tt, lb, ad, use_triton=True, prefetch=region[:1])
    assert all(torch.equal(p, q) for p, q in zip(m0, m1))
    kc = torch.randn(1, 4, 256, 128, device="cuda", generator=g).to(bf)
    vc = torch.randn(1, 4, 256, 128, device="cuda", generator=g).to(bf)
    q = torch.randn(1, 28, 128, device="cuda", generator=g).to(bf)
    valid = torch.ones(1, 256, dtype=torch.bool, device="cuda")
    slot = torch.tensor([200], device="cuda")
    o0 = decode.decode_attention(q, kc, vc, valid, slot, 256, 128 ** -0.5, use_triton=True, splits=2)
    o1 = decode.decode_attention(q, kc, vc, valid, slot, 256, 128 ** -0.5, use_triton=True, splits=2,
                                 prefetch=region)
    assert torch.equal(o0, o1)


@pytest.mark.skipif(not CUDA, reason="CUDA graphs need a GPU")
def test_engine_with_and_without_the_prefetch_samples_the_same_bits(monkeypatch):
    from qerl.profiling.build import build_random_model
    from qerl.rl.engine import DecodeEngine
    model = build_random_model("0.5B", "qerl", rank=8, layers=2, device="cuda")
    ids = torch.randint(0, 1000, (1, 24), device="cuda")
    attn = torch.ones_like(ids)
    outs = []
    for flag in ("0", "1"):
        monkeypatch.setenv("QERL_L2_PREFETCH", flag)
        eng = DecodeEngine(model, batch=1, max_len=56, bucket=16)
        assert eng.l2_prefetch == (flag == "1")
        assert all(g.l2_regions for groups in eng._groups for g in groups)  # 0.5B's weights all fit in L2
        assert bool(eng._prefetch(eng._groups[0][1], True)) == (flag == "1")
        torch.manual_seed(5)
        outs.append(eng.generate(ids, attn, max_new_tokens=32, temperature=1.0, force_length=True))
    assert torch.equal(outs[0].tokens, outs[1].tokens) and torch.equal(outs[0].logp, outs[1].logp)
