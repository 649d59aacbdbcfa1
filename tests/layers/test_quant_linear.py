"""QuantLinear, the w4a16 entry point and quantize_: numerics, autograd, dtype moves, peft LoRA, checkpointing,
torch.compile and memory."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from qerl.formats import BITS_PER_WEIGHT
from qerl.layers import (
    DEFAULT_TARGETS,
    MXFP4Config,
    NVFP4Config,
    QuantLinear,
    expected_nbytes,
    model_nbytes,
    quantize_,
    w4a16_linear,
    w4a16_linear_reference,
)

FMTS = ["nvfp4", "mxfp4"]
CONFIGS = {"nvfp4": NVFP4Config(), "mxfp4": MXFP4Config()}


def tiny_qwen2(seed: int = 0, tie: bool = True):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen2Config(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                      tie_word_embeddings=tie)
    return Qwen2ForCausalLM(cfg).eval()


@pytest.fixture
def linear():
    torch.manual_seed(0)
    return nn.Linear(64, 48, bias=True)


# ---------------------------------------------------------------- numerics and autograd
@pytest.mark.parametrize("fmt", FMTS)
def test_forward_and_input_grad_match_the_torch_reference(linear, fmt):
    q = QuantLinear.from_linear(linear, fmt)
    x = torch.randn(3, 5, 64, requires_grad=True)
    x_ref = x.detach().clone().requires_grad_()
    y = q(x)
    y_ref = w4a16_linear_reference(x_ref, q.codes, q.scales, q.global_scale, q.bias, fmt=fmt)
    torch.testing.assert_close(y, y_ref, rtol=0, atol=0)
    g = torch.randn_like(y)
    y.backward(g)
    y_ref.backward(g)
    torch.testing.assert_close(x.grad, x_ref.grad)
    torch.testing.assert_close(x.grad, g @ q.weight)  # grad_x = grad_y @ W_dequant
    rel = (y - linear(x)).norm() / linear(x).norm()
    assert rel < 0.15


def test_weight_has_no_gradient_and_bias_grad_only_when_asked(linear):
    q = QuantLinear.from_linear(linear, "nvfp4")
    assert all(not b.is_floating_point() for b in q.buffers())  # packed bytes only: nothing autograd can touch
    assert not q.bias.requires_grad
    x = torch.randn(4, 64, requires_grad=True)
    q(x).sum().backward()
    assert q.bias.grad is None and x.grad is not None
    q.bias.requires_grad_(True)
    g = torch.randn(4, 48)
    q(x).backward(g)
    torch.testing.assert_close(q.bias.grad, g.sum(0))


def test_entry_point_rejects_bad_shapes_and_formats(linear):
    q = QuantLinear.from_linear(linear, "nvfp4")
    with pytest.raises(ValueError, match=r"\(2, 32\).*\(48, 64\)"):
        q(torch.randn(2, 32))
    with pytest.raises(ValueError, match="unknown 4-bit format"):
        w4a16_linear(torch.randn(2, 64), q.codes, q.scales, q.global_scale, fmt="int4")
    with pytest.raises(ValueError, match=r"in_features=40.*block size 32"):
        QuantLinear(40, 8, fmt="mxfp4")


@pytest.mark.parametrize("fmt", FMTS)
def test_dtype_casts_keep_packed_bytes_and_follow_compute_dtype(linear, fmt):
    q = QuantLinear.from_linear(linear, fmt)
    state = {k: v.clone() for k, v in q.state_dict().items()}
    x = torch.randn(2, 64)
    y32 = q(x)
    q.to(torch.bfloat16)
    assert q.compute_dtype == torch.bfloat16 and q.bias.dtype == torch.bfloat16
    for name in ("codes", "scale_bits") + (("global_scale_bits",) if fmt == "nvfp4" else ()):
        assert torch.equal(getattr(q, name), state[name]), name
    y16 = q(x.bfloat16())
    assert y16.dtype == torch.bfloat16
    torch.testing.assert_close(y16.float(), y32, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("fmt", FMTS)
def test_state_dict_roundtrip(linear, fmt):
    q = QuantLinear.from_linear(linear, fmt)
    fresh = QuantLinear(64, 48, bias=True, fmt=fmt)
    fresh.load_state_dict(q.state_dict())
    x = torch.randn(2, 64)
    assert torch.equal(fresh(x), q(x))
    assert torch.equal(q.packed().codes, q.codes)


@pytest.mark.parametrize("fmt", FMTS)
def test_kept_dense_weight_gives_the_same_numbers_and_follows_the_buffers(linear, fmt, monkeypatch):
    """QuantLinear.dense_weight: forward and input gradient bit for bit those of dequantizing on every call, also
    without autograd (F.linear with the kept copy, no autograd.Function); a new copy after load_state_dict or a dtype
    change; none for a layer above the size cap."""
    import qerl.layers.quant_linear as ql

    q = QuantLinear.from_linear(linear, fmt)
    x = torch.randn(3, 5, 64, requires_grad=True)
    x_ref = x.detach().clone().requires_grad_()
    y = q(x)
    kept = q.dense_weight(torch.float32)
    assert kept is q.dense_weight(torch.float32)  # computed once, then reused
    y_ref = w4a16_linear(x_ref, q.codes, q.scales, q.global_scale, q.bias, fmt=fmt)  # dequantized on the call
    assert torch.equal(y, y_ref)
    with torch.no_grad():
        assert torch.equal(q(x), y_ref)
    g = torch.randn_like(y)
    y.backward(g)
    y_ref.backward(g)
    assert torch.equal(x.grad, x_ref.grad)
    other = QuantLinear.from_linear(nn.Linear(64, 48), fmt)
    q.load_state_dict(other.state_dict())  # in-place copies into the buffers: the kept copy is stale
    assert torch.equal(q.dense_weight(torch.float32), other.weight) and torch.equal(q(x), other(x))
    assert torch.equal(q.dense_weight(torch.bfloat16), other.weight.to(torch.bfloat16))
    monkeypatch.setattr(ql, "DENSE_CACHE_ELEMENTS", 64 * 48 - 1)
    assert q.dense_weight(torch.float32) is None


@pytest.mark.parametrize("fmt", FMTS)
def test_share_kernel_storage_rehomes_the_buffers_without_changing_anything_a_reader_sees(fmt):
    """share_kernel_storage: the layers' kernel buffers become consecutive row views of one allocation (the group
    concat_prepared would copy, bit for bit), their forward, state_dict and bytes held do not change, and a second
    call (a new decode engine on the same model) returns the same group without copying."""
    import qerl_kernels
    from qerl.layers import share_kernel_storage
    from qerl_kernels.layout import stacked_view

    torch.manual_seed(1)
    layers = [QuantLinear.from_linear(nn.Linear(256, n, bias=n == 40), fmt) for n in (200, 40, 40)]
    holder = nn.ModuleList(layers)
    x = torch.randn(3, 256)
    for q in layers:
        q.prepare_kernels()
    before = [q(x) for q in layers]
    sd = {k: v.clone() for k, v in holder.state_dict().items()}
    nbytes = model_nbytes(holder)
    copy = qerl_kernels.concat_prepared([q.prepared() for q in layers])
    assert stacked_view([q.prepared() for q in layers]) is None  # separate allocations: no view
    group = share_kernel_storage(layers)
    for name in ("words", "scales", "out_scales"):
        assert torch.equal(getattr(group, name), getattr(copy, name))
    assert (group.n, group.k, group.parts) == (copy.n, copy.k, copy.parts) == (256 + 128 + 40, 256,
                                                                               ((0, 200), (256, 40), (384, 40)))
    for q, (row, _) in zip(layers, group.parts):
        assert q.w4_words.untyped_storage().data_ptr() == group.words.untyped_storage().data_ptr()
        assert q.w4_words.data_ptr() == group.words[row].data_ptr()
        assert q.w4_scales.data_ptr() == group.scales[row].data_ptr()
    assert [torch.equal(q(x), y) for q, y in zip(layers, before)] == [True] * 3
    after = holder.state_dict()
    assert after.keys() == sd.keys() and all(torch.equal(after[k], v) for k, v in sd.items())
    assert model_nbytes(holder) == nbytes
    again = share_kernel_storage(layers)
    assert again.words.data_ptr() == group.words.data_ptr() and again.scales.data_ptr() == group.scales.data_ptr()
    assert torch.equal(again.words, copy.words) and again.parts == copy.parts
    with pytest.raises(ValueError, match="share K"):
        share_kernel_storage([layers[0], QuantLinear.from_linear(nn.Linear(128, 8), fmt)])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the CUDA kernels' dispatch")
@pytest.mark.parametrize("fmt", FMTS)
def test_cuda_kept_dense_weight_is_the_dispatch_product_above_its_fused_limit(fmt):
    """On CUDA a small layer keeps its dequantized weight for calls above dequantize_only_above() rows only, and its
    forward there equals the kernels' entry point (dequantize + cuBLAS at those rows) bit for bit, its input and bias
    gradients within bfloat16 rounding; decode-sized calls get no copy (the fused kernels run)."""
    from qerl.layers.ops import w4a16_linear_prepared
    from qerl_kernels.fp4_launch import dequantize_only_above

    torch.manual_seed(0)
    q = QuantLinear.from_linear(nn.Linear(576, 1536, bias=True), fmt).to("cuda", torch.bfloat16)
    q.prepare_kernels()
    m = dequantize_only_above() + 64
    assert q.dense_weight(torch.bfloat16, rows=16) is None and q.dense_weight(torch.bfloat16) is None
    q.bias.requires_grad_(True)
    x = torch.randn(2, m // 2, 576, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    x_ref = x.detach().clone().requires_grad_()
    y = q(x)
    kept = q.dense_weight(torch.bfloat16, rows=m)
    assert kept is not None and kept is q.dense_weight(torch.bfloat16, rows=m)
    y_ref = w4a16_linear_prepared(x_ref, q.prepared(), q.bias)
    assert torch.equal(y, y_ref)
    g = torch.randn_like(y)
    y.backward(g)
    gb, q.bias.grad = q.bias.grad.clone(), None
    y_ref.backward(g)
    torch.testing.assert_close(x.grad, x_ref.grad)
    torch.testing.assert_close(gb, q.bias.grad)
    small = x[:, :8].detach()
    assert torch.equal(q(small), w4a16_linear_prepared(small, q.prepared(), q.bias))


# ---------------------------------------------------------------- quantize_
def test_quantize_targets_only_the_seven_projections():
    model = tiny_qwen2()
    quantize_(model, NVFP4Config())
    names = {n.rsplit(".", 1)[-1] for n, m in model.named_modules() if isinstance(m, QuantLinear)}
    assert names == set(DEFAULT_TARGETS)
    assert sum(isinstance(m, QuantLinear) for m in model.modules()) == 2 * 7
    assert isinstance(model.lm_head, nn.Linear) and isinstance(model.model.embed_tokens, nn.Embedding)


def test_quantize_filter_fn_and_error_names_the_layer():
    model = tiny_qwen2()
    quantize_(model, MXFP4Config(), filter_fn=lambda m, fqn: isinstance(m, nn.Linear) and ".mlp." in fqn)
    kinds = {n.rsplit(".", 1)[-1] for n, m in model.named_modules() if isinstance(m, QuantLinear)}
    assert kinds == {"gate_proj", "up_proj", "down_proj"}
    bad = nn.Sequential(nn.Linear(24, 8))
    with pytest.raises(ValueError, match=r"'0'.*\(8, 24\)"):
        quantize_(bad, NVFP4Config(), filter_fn=lambda m, fqn: isinstance(m, nn.Linear))


@pytest.mark.parametrize("fmt", FMTS)
def test_quantized_model_output_is_close_to_full_precision(fmt):
    model = tiny_qwen2()
    ids = torch.randint(0, 96, (2, 12))
    with torch.no_grad():
        ref = model(ids).logits
        quantize_(model, CONFIGS[fmt])
        out = model(ids).logits
    assert (out - ref).norm() / ref.norm() < 0.2


@pytest.mark.parametrize("fmt", FMTS)
def test_memory_is_within_5_percent_of_what_the_format_implies(fmt):
    model = tiny_qwen2(tie=False)
    implied = expected_nbytes(model, fmt)
    full = model_nbytes(model)
    quantize_(model, CONFIGS[fmt])
    actual = model_nbytes(model)
    assert abs(actual - implied) / implied < 0.05
    assert actual < full
    # the quantized layers alone: bytes per weight = the format's bits / 8
    qbytes = sum(b.untyped_storage().nbytes() for m in model.modules() if isinstance(m, QuantLinear)
                 for b in m.buffers())
    n_weights = sum(m.in_features * m.out_features for m in model.modules() if isinstance(m, QuantLinear))
    assert abs(qbytes * 8 / n_weights - BITS_PER_WEIGHT[fmt]) / BITS_PER_WEIGHT[fmt] < 0.05


# ---------------------------------------------------------------- peft LoRA, checkpointing, compile
def _lora_model(fmt: str, seed: int = 0):
    import peft

    from qerl.layers.lora import lora_config

    model = tiny_qwen2(seed)
    quantize_(model, CONFIGS[fmt])
    return peft.get_peft_model(model, lora_config(r=4, lora_alpha=8, lora_dropout=0.0,
                                                  target_modules=list(DEFAULT_TARGETS)))


@pytest.mark.parametrize("fmt", FMTS)
def test_lora_wrapped_quantized_model_trains_on_cpu(fmt):
    from qerl.layers.lora import QuantLoraLinear

    model = _lora_model(fmt)
    wrapped = [m for m in model.modules() if isinstance(m, QuantLoraLinear)]
    assert len(wrapped) == 14
    frozen = {n: b.clone() for n, b in model.named_buffers() if "codes" in n or "scale" in n}
    trainable = [p for p in model.parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n, p in model.named_parameters() if p.requires_grad)
    torch.manual_seed(1)
    ids = torch.randint(0, 96, (4, 16))
    opt = torch.optim.AdamW(trainable, lr=1e-2)
    losses = []
    model.train()
    for _ in range(12):
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    assert losses[-1] < losses[0] - 0.3, losses
    for n, b in model.named_buffers():
        if n in frozen:
            assert torch.equal(b, frozen[n]), n
    with pytest.raises(RuntimeError, match="cannot merge"):
        wrapped[0].merge()


@pytest.mark.parametrize("reentrant", [False, True], ids=["non_reentrant", "reentrant"])
def test_gradient_checkpointing_gives_the_same_lora_gradients(reentrant):
    ids = torch.randint(0, 96, (2, 12), generator=torch.Generator().manual_seed(0))
    grads = []
    for checkpointing in (False, True):
        model = _lora_model("nvfp4", seed=3)
        for n, p in model.named_parameters():  # non-zero B so gradients reach A too
            if "lora_B" in n:
                torch.nn.init.normal_(p, std=0.02, generator=torch.Generator().manual_seed(hash(n) % 1000))
        model.train()
        if checkpointing:
            kwargs = {"use_reentrant": reentrant}
            if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.24 (earlier: gradient_*)
                model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
            else:
                model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
            model.enable_input_require_grads()
        model(input_ids=ids, labels=ids).loss.backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad})
    assert grads[0].keys() == grads[1].keys()
    for n in grads[0]:
        torch.testing.assert_close(grads[1][n], grads[0][n], rtol=1e-4, atol=1e-6, msg=n)
    assert any(g.abs().sum() > 0 for g in grads[1].values())


@pytest.mark.parametrize("fmt", FMTS)
def test_torch_compile_matches_eager(linear, fmt):
    torch._dynamo.reset()
    q = QuantLinear.from_linear(linear, fmt)
    lora_a = nn.Linear(64, 4, bias=False)

    def f(x):
        return q(x) + lora_a(x).sum(-1, keepdim=True)

    compiled = torch.compile(f, backend="aot_eager", fullgraph=True)
    x1 = torch.randn(3, 64, requires_grad=True)
    x2 = x1.detach().clone().requires_grad_()
    y1, y2 = f(x1), compiled(x2)
    torch.testing.assert_close(y2, y1)
    y1.square().sum().backward()
    y2.square().sum().backward()
    torch.testing.assert_close(x2.grad, x1.grad)
