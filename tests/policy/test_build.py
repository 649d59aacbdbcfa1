"""The policy core (qerl.policy.build_policy): the tokenizer exactly as saved, every format, a saved LoRA adapter on
a 4-bit base, quantized checkpoints, new trainable adapters (and RMSNorm weights), AQN, a model given in memory, and
clear errors for bad folders and impossible combinations."""
from __future__ import annotations

import pytest
import torch

from qerl.data.prompts import build_prompt
from qerl.evaluate.adapter_check import check_adapter_active
from qerl.policy import (AqnSpec, LoraSpec, build_policy, checkpoint_format, load_adapter, load_tokenizer,
                         weight_nbytes)

TEXT = "<think> 4 + 13 = 17 </think> <answer> 17 </answer>"


def test_saved_tiny_tokenizer_loads_unchanged(base_dir, tokenizer):
    loaded = load_tokenizer(base_dir)
    ids = tokenizer(TEXT, add_special_tokens=False)["input_ids"]
    assert loaded(TEXT, add_special_tokens=False)["input_ids"] == ids
    assert loaded.decode(ids) == TEXT
    assert build_prompt("Ann has 3 apples .", loaded) == build_prompt("Ann has 3 apples .", tokenizer)


@pytest.mark.parametrize("method, fmt", [("bf16", "bf16"), ("nvfp4", "nvfp4"), ("mxfp4_lora", "mxfp4"),
                                         ("qerl", "nvfp4"), ("full", "bf16")], ids=lambda x: str(x))
def test_every_method_gets_its_format(base_dir, method, fmt):
    lora = LoraSpec(rank=4, alpha=8) if method in ("mxfp4_lora", "qerl") else None
    policy = build_policy(method, base_dir, lora=lora)
    assert checkpoint_format(policy.model) == policy.info["format"] == fmt
    assert policy.info["nbytes"] == weight_nbytes(policy.model) > 0
    trainable = policy.trainable_parameters()
    if method == "full":
        assert len(trainable) == len(list(policy.model.parameters()))
    elif lora is not None:
        assert trainable and all("lora_" in n for n, p in policy.model.named_parameters() if p.requires_grad)


def test_quantized_base_with_a_saved_adapter(tmp_path, base_dir, tokenizer):
    from peft import get_peft_model

    from qerl.layers import QuantLinear
    from qerl.layers.lora import lora_config

    policy = build_policy("nvfp4", base_dir)
    assert policy.info["format"] == "nvfp4" and "round-to-nearest" in policy.info["quantization"]
    peft_model = get_peft_model(policy.model, lora_config(r=4, lora_alpha=8,
                                                          target_modules=["q_proj", "v_proj", "up_proj"]))
    for name, p in peft_model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(p, std=0.05)
    peft_model.save_pretrained(tmp_path / "adapter")
    ids = tokenizer(build_prompt("Ann has 3 apples .", tokenizer), return_tensors="pt", add_special_tokens=False)
    with torch.no_grad():
        expected = peft_model.eval()(**ids).logits

    loaded = build_policy("nvfp4", base_dir, adapter=tmp_path / "adapter")
    assert loaded.info["adapter"] == str(tmp_path / "adapter")
    assert sum(isinstance(m, QuantLinear) for m in loaded.model.modules()) == 2 * 7
    with torch.no_grad():
        assert torch.equal(loaded.model(**ids).logits, expected)
    assert check_adapter_active(loaded.model, loaded.tokenizer)["passed"]


def test_new_adapters_train_norms_and_aqn(base_dir):
    from qerl.noise import NoiseSchedule

    policy = build_policy("qerl", base_dir, lora=LoraSpec(rank=4, alpha=8, train_norms=True),
                          aqn=AqnSpec(NoiseSchedule(4, 2, 0.05, 0.01), seed=3), gradient_checkpointing=True)
    names = [n for n, p in policy.model.named_parameters() if p.requires_grad]
    assert any("lora_A" in n for n in names) and sum("layernorm.modules_to_save" in n for n in names) == 4
    norm = next(p for n, p in policy.model.named_parameters()
                if n.endswith("input_layernorm.modules_to_save.default.weight"))
    before = norm.detach().clone()
    with policy.rollout_noise(0) as sigma0:
        assert sigma0 == 0.0 and torch.equal(norm, before)  # stage 0 adds no noise
    with policy.rollout_noise(3) as sigma:
        assert sigma > 0 and not torch.equal(norm, before)
    assert torch.equal(norm, before)  # restored exactly
    plain = build_policy("lora", base_dir, lora=LoraSpec(rank=4, alpha=8))
    with plain.rollout_noise(3) as sigma:
        assert sigma == 0.0 and plain.aqn is None
    # per-forward resampling works through hooks the rollout engine would bypass: the rollout asks for the eager loop
    per_forward = build_policy("qerl", base_dir, lora=LoraSpec(rank=4, alpha=8),
                               aqn=AqnSpec(NoiseSchedule(4, 2, 0.05, 0.01), seed=3, resample="forward"))
    assert per_forward.eager_rollout and not policy.eager_rollout and not plain.eager_rollout


def test_a_model_in_memory(tiny_model, tokenizer):
    policy = build_policy("mxfp4", tiny_model, tokenizer=tokenizer)  # BF16 given: round-to-nearest now
    assert checkpoint_format(policy.model) == "mxfp4" and policy.tokenizer is tokenizer
    again = build_policy("mxfp4_lora", policy.model, lora=LoraSpec(rank=2, alpha=4))  # already mxfp4: as it is
    assert again.info["quantization"] == "mxfp4 (given model)"
    with pytest.raises(ValueError, match="holds mxfp4 weights, but method 'nvfp4' needs nvfp4"):
        build_policy("nvfp4", policy.model)


def test_bad_folders_formats_and_combinations(tmp_path, base_dir, tiny_model):
    with pytest.raises(ValueError, match="no config.json"):
        build_policy("bf16", tmp_path / "nowhere")
    with pytest.raises(ValueError, match="unknown method 'int4'"):
        build_policy("int4", base_dir)
    with pytest.raises(ValueError, match="adapter_config.json"):
        load_adapter(tiny_model, tmp_path)
    with pytest.raises(ValueError, match="model.dtype"):
        build_policy("bf16", base_dir, dtype="float8")
    with pytest.raises(ValueError, match="does not train LoRA"):
        build_policy("full", base_dir, lora=LoraSpec(rank=2, alpha=4))
    with pytest.raises(ValueError, match="not both"):
        build_policy("qerl", base_dir, lora=LoraSpec(rank=2, alpha=4), adapter=tmp_path)
    with pytest.raises(ValueError, match="has BF16 weights"):
        build_policy("lora", base_dir, quantized=tmp_path, lora=LoraSpec(rank=2, alpha=4))


def test_quantized_checkpoint_replaces_round_to_nearest(tmp_path, base_dir):
    from qerl.policy.checkpoint import save_quantized

    rtn = build_policy("mxfp4", base_dir)
    save_quantized(rtn.model, tmp_path / "q")
    loaded = build_policy("mxfp4", base_dir, quantized=tmp_path / "q")
    assert loaded.info["quantized_dir"] == str(tmp_path / "q")
    ids = rtn.tokenizer("<think> 1 </think>", return_tensors="pt", add_special_tokens=False)
    with torch.no_grad():
        assert torch.allclose(loaded.model(**ids).logits, rtn.model(**ids).logits)
    with pytest.raises(ValueError, match="holds mxfp4 weights"):
        build_policy("nvfp4", base_dir, quantized=tmp_path / "q")


def test_new_adapters_start_the_same_in_every_weight_format(tmp_path, base_dir):
    """Seeded alike, BF16 LoRA, a round-to-nearest NVFP4 base and a quantized checkpoint (load_quantized) draw the same
    initial LoRA factors: building or loading the base consumes none of the global RNG, so runs of different methods
    at one seed start from the same adapters (a loader that drew from it, as load_quantized's random initialization
    did before it built on the meta device, would silently make every 4-bit run another draw)."""
    from qerl.policy.checkpoint import save_quantized

    save_quantized(build_policy("nvfp4", base_dir).model, tmp_path / "q")
    factors = []
    for method, quantized in (("lora", None), ("nvfp4_lora", None), ("nvfp4_lora", tmp_path / "q")):
        torch.manual_seed(7)
        policy = build_policy(method, base_dir, quantized=quantized, lora=LoraSpec(rank=4, alpha=8))
        factors.append({n.split("base_model.")[-1]: p.detach().clone() for n, p in policy.model.named_parameters()
                        if "lora_A" in n})
    assert factors[0] and factors[0].keys() == factors[1].keys() == factors[2].keys()
    assert all(torch.equal(factors[0][n], f[n]) for f in factors[1:] for n in factors[0])
