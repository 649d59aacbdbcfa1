"""Model loading for evaluation: the tokenizer exactly as saved, formats, a saved LoRA adapter on a 4-bit base,
quantized checkpoints, and clear errors for bad folders."""
from __future__ import annotations

import pytest
import torch

from qerl.data.prompts import build_prompt
from qerl.evaluate.load import load_adapter, load_model, load_tokenizer
from qerl.evaluate.run import check_adapter_active

TEXT = "<think> 4 + 13 = 17 </think> <answer> 17 </answer>"


@pytest.fixture()
def base_dir(tmp_path, tokenizer, tiny_model):
    path = tmp_path / "base"
    tiny_model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def test_saved_tiny_tokenizer_loads_unchanged(base_dir, tokenizer):
    loaded = load_tokenizer(base_dir)
    ids = tokenizer(TEXT, add_special_tokens=False)["input_ids"]
    assert loaded(TEXT, add_special_tokens=False)["input_ids"] == ids
    assert loaded.decode(ids) == TEXT
    assert build_prompt("Ann has 3 apples .", loaded) == build_prompt("Ann has 3 apples .", tokenizer)


def test_quantized_base_with_a_saved_adapter(tmp_path, base_dir, tokenizer):
    from peft import get_peft_model

    from qerl.layers import QuantLinear
    from qerl.layers.lora import lora_config

    model, _, info = load_model(base_dir, "nvfp4")
    assert info["format"] == "nvfp4" and "round-to-nearest" in info["quantization"]
    peft_model = get_peft_model(model, lora_config(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "up_proj"]))
    for name, p in peft_model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(p, std=0.05)
    peft_model.save_pretrained(tmp_path / "adapter")
    ids = tokenizer(build_prompt("Ann has 3 apples .", tokenizer), return_tensors="pt", add_special_tokens=False)
    with torch.no_grad():
        expected = peft_model.eval()(**ids).logits

    loaded, tok, info = load_model(base_dir, "nvfp4", adapter=tmp_path / "adapter")
    assert info["adapter"] == str(tmp_path / "adapter")
    assert sum(isinstance(m, QuantLinear) for m in loaded.modules()) == 2 * 7
    with torch.no_grad():
        assert torch.equal(loaded(**ids).logits, expected)
    assert check_adapter_active(loaded, tok)["passed"]


def test_bad_folders_and_formats(tmp_path, base_dir, tiny_model):
    with pytest.raises(ValueError, match="no config.json"):
        load_model(tmp_path / "nowhere")
    with pytest.raises(ValueError, match="unknown weight format"):
        load_model(base_dir, "int4")
    with pytest.raises(ValueError, match="adapter_config.json"):
        load_adapter(tiny_model, tmp_path)
    with pytest.raises(ValueError, match="model.dtype"):
        load_model(base_dir, "bf16", dtype="float8")


def test_quantized_checkpoint_replaces_round_to_nearest(tmp_path, base_dir):
    checkpoint = pytest.importorskip("qerl.quantize.checkpoint")
    model, tok, _ = load_model(base_dir, "mxfp4")
    checkpoint.save_quantized(model, tmp_path / "q")
    loaded, _, info = load_model(base_dir, "mxfp4", quantized=tmp_path / "q")
    assert info["quantized_dir"] == str(tmp_path / "q")
    ids = tok("<think> 1 </think>", return_tensors="pt", add_special_tokens=False)
    with torch.no_grad():
        assert torch.allclose(loaded(**ids).logits, model(**ids).logits)
    with pytest.raises(ValueError, match="holds mxfp4 weights"):
        load_model(base_dir, "nvfp4", quantized=tmp_path / "q")
