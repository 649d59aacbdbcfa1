"""AQN on a small transformers Qwen2ForCausalLM (hidden 64, 2 layers): noise on, off, exact restore, seeding,
per-forward resampling, exceptions, and a peft LoRA wrapper.

Run: `pytest tests/noise/test_aqn_noise.py -q`
"""
from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from qerl.noise import AdaptiveQuantizationNoise, NoiseSchedule, applied, find_norm_weights  # noqa: E402

SIGMA = 1e-2


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    config = transformers.Qwen2Config(
        vocab_size=97, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64,
    )
    m = transformers.Qwen2ForCausalLM(config).eval()
    with torch.no_grad():  # RMSNorm weights start at exactly 1; make them distinct so restores are meaningful
        for _, norm in find_norm_weights(m):
            norm.weight.uniform_(0.5, 1.5)
    return m


@pytest.fixture(scope="module")
def ids():
    return torch.randint(0, 97, (2, 12), generator=torch.Generator().manual_seed(1))


def _logits(model, ids):
    with torch.no_grad():
        return model(ids).logits


def _state(model):
    return {k: v.clone() for k, v in model.state_dict().items()}


def _assert_same_state(model, before):
    after = model.state_dict()
    assert after.keys() == before.keys()
    for key, value in before.items():
        assert torch.equal(after[key], value), key


def test_finds_the_four_decoder_norms(model):
    names = [name for name, _ in find_norm_weights(model)]
    assert names == [
        "model.layers.0.input_layernorm", "model.layers.0.post_attention_layernorm",
        "model.layers.1.input_layernorm", "model.layers.1.post_attention_layernorm",
    ]  # the final model.norm (feeding lm_head) is left alone


def test_noise_changes_logits_and_is_removed_bit_exactly(model, ids):
    clean = _logits(model, ids)
    before = _state(model)
    with applied(model, SIGMA, torch.Generator().manual_seed(0)) as names:
        assert len(names) == 4
        noisy = _logits(model, ids)
        for key, value in model.state_dict().items():  # only the perturbed norms differ
            assert torch.equal(value, before[key]) != any(key.startswith(n + ".") for n in names), key
    assert not torch.allclose(clean, noisy)
    _assert_same_state(model, before)
    assert torch.equal(_logits(model, ids), clean)


def test_sigma_zero_is_a_no_op(model, ids):
    clean = _logits(model, ids)
    before = _state(model)
    with applied(model, 0.0, torch.Generator().manual_seed(0)) as names:
        assert names == []
        _assert_same_state(model, before)
        assert torch.equal(_logits(model, ids), clean)
    _assert_same_state(model, before)


def test_noise_is_gaussian_of_shape_d_and_seeded(model, ids):
    norms = find_norm_weights(model)
    originals = [m.weight.detach().clone() for _, m in norms]
    with applied(model, SIGMA, torch.Generator().manual_seed(7)):
        deltas = [m.weight.detach() - o for (_, m), o in zip(norms, originals)]
        first = _logits(model, ids)
    expected_gen = torch.Generator().manual_seed(7)
    for delta in deltas:  # Z ~ N(0, sigma^2) of shape (d,), one draw per norm in named_modules order
        assert delta.shape == (64,)
        assert torch.allclose(delta, torch.randn(64, generator=expected_gen) * SIGMA, atol=1e-7)
    with applied(model, SIGMA, torch.Generator().manual_seed(7)):
        assert torch.equal(_logits(model, ids), first)  # same seed, same noise
    with applied(model, SIGMA, torch.Generator().manual_seed(8)):
        assert not torch.equal(_logits(model, ids), first)


def test_per_step_keeps_noise_per_forward_resamples(model, ids):
    before = _state(model)
    with applied(model, SIGMA, torch.Generator().manual_seed(0), resample="step"):
        assert torch.equal(_logits(model, ids), _logits(model, ids))
    with applied(model, SIGMA, torch.Generator().manual_seed(0), resample="forward"):
        a, b = _logits(model, ids), _logits(model, ids)
        with torch.inference_mode():  # the hooks also work under inference_mode (generation)
            c = model(ids).logits
    assert not torch.equal(a, b) and not torch.equal(b, c)
    _assert_same_state(model, before)
    with applied(model, SIGMA, torch.Generator().manual_seed(0), resample="forward"):
        assert torch.equal(_logits(model, ids), a)  # per-forward noise is seeded too
    assert all(not norm._forward_pre_hooks for _, norm in find_norm_weights(model))  # hooks removed


def test_restores_on_exception(model, ids):
    clean = _logits(model, ids)
    before = _state(model)
    with pytest.raises(RuntimeError, match="rollout failed"):
        with applied(model, 0.5, torch.Generator().manual_seed(0), resample="forward"):
            _logits(model, ids)
            raise RuntimeError("rollout failed")
    _assert_same_state(model, before)
    assert torch.equal(_logits(model, ids), clean)


def test_bfloat16_weights_restore_exactly(ids):
    torch.manual_seed(0)
    config = transformers.Qwen2Config(vocab_size=97, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                                      num_attention_heads=4, num_key_value_heads=2)
    m = transformers.Qwen2ForCausalLM(config).to(torch.bfloat16).eval()
    before = _state(m)
    with applied(m, 3e-3, torch.Generator().manual_seed(0)):
        noisy = m.model.layers[0].input_layernorm.weight
        assert not torch.equal(noisy, before["model.layers.0.input_layernorm.weight"])
    _assert_same_state(m, before)


def test_schedule_driven_object(model, ids):
    aqn = AdaptiveQuantizationNoise(NoiseSchedule(total_steps=100, num_stages=10), seed=3)
    clean = _logits(model, ids)
    def at(step):
        return applied(model, aqn.sigma(step), aqn.generator(step))

    assert aqn.sigma(5) == 0.0  # stage 0: no noise
    with at(5):
        assert torch.equal(_logits(model, ids), clean)
    assert aqn.sigma(10) == pytest.approx(1e-2)  # stage 1: s_start
    with at(10):
        step10 = _logits(model, ids)
    with at(10):
        assert torch.equal(_logits(model, ids), step10)  # step-seeded: a resumed run draws the same noise
    with at(11):
        assert not torch.equal(_logits(model, ids), step10)
    assert torch.equal(_logits(model, ids), clean)


def test_peft_lora_wrapped_model(model, ids):
    peft = pytest.importorskip("peft")
    import copy

    wrapped = peft.get_peft_model(copy.deepcopy(model), peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
    names = [name for name, _ in find_norm_weights(wrapped)]
    assert names == [f"base_model.model.model.layers.{i}.{n}" for i in (0, 1)
                     for n in ("input_layernorm", "post_attention_layernorm")]
    clean = _logits(wrapped, ids)
    before = _state(wrapped)
    with applied(wrapped, SIGMA, torch.Generator().manual_seed(0)):
        assert not torch.allclose(_logits(wrapped, ids), clean)
    _assert_same_state(wrapped, before)
    assert torch.equal(_logits(wrapped, ids), clean)


def test_bad_arguments_raise_value_error(model):
    for sigma in (-1e-3, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="sigma must be a finite number"):
            with applied(model, sigma):
                pass
    with pytest.raises(ValueError, match="resample must be one of"):
        with applied(model, SIGMA, resample="token"):
            pass
    with pytest.raises(ValueError, match="found no RMSNorm to perturb in Sequential"):
        with applied(torch.nn.Sequential(torch.nn.Linear(4, 4)), SIGMA):
            pass
