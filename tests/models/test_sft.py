"""`qerl sft`: the supervised warm-up on GSM8K training solutions (the small scale's stage before RL).

The tiny Qwen2 built in code stands in for SmolLM2 (the real model goes through the stage in
tests/test_small_smoke.py's DAG). Run: `python -m pytest -q tests/models/test_sft.py`.
"""
from __future__ import annotations

import json

import pytest
import torch

from qerl.config import validate_config
from qerl.data.benchmarks import Problem
from qerl.models.sft import run_sft, sft_rows


def _cfg(data_root, **sft):
    return validate_config({"scale": "small", "data": {"root": str(data_root), "benchmarks": ["gsm8k"]},
                            "sft": {"steps": 8, "limit": 2, "batch_size": 2, "lr": 2.0e-2, "warmup_steps": 0,
                                    "max_tokens": 4096, **sft}}, check_data=False)


def test_rows_drop_calculator_notes_and_keep_the_final_answer():
    p = Problem("gsm8k/train/0", "Q?", "72", None, "48/2 = <<48/2=24>>24 clips\n48+24 = <<48+24=72>>72\n#### 72", "gsm8k")
    (row,) = sft_rows([p])
    assert row == {"question": "Q?", "answer": "48/2 = 24 clips\n48+24 = 72\n#### 72"}
    with pytest.raises(ValueError, match="#### N"):
        sft_rows([Problem("math/0", "Q?", "1", 3, None, "math500")])


def test_sft_lowers_the_loss_and_writes_a_reloadable_model(tmp_path, shared_data_root, tokenizer, tiny_model):
    from transformers import AutoModelForCausalLM

    from qerl.policy.core import load_tokenizer

    base = tmp_path / "pretrained"
    tiny_model.save_pretrained(base)
    tokenizer.save_pretrained(base)
    info = run_sft(_cfg(shared_data_root), base, tmp_path / "base", device="cpu")
    assert info["steps"] == 8 and info["rows_kept"] == 2 and info["epochs"] == 8.0
    out = tmp_path / "base"
    assert (out / "sft_info.json").is_file() and not list(tmp_path.glob(".*partial*"))
    assert json.loads((out / "sft_info.json").read_text())["source"] == "gsm8k"
    tuned = AutoModelForCausalLM.from_pretrained(out)
    before = dict(tiny_model.named_parameters())
    assert any(not torch.equal(p, before[n]) for n, p in tuned.named_parameters())
    # the completion loss on the training rows fell (encoded by the tokenizer the stage saved and trained with)
    saved = load_tokenizer(out)
    assert _loss(saved, tuned, shared_data_root) < 0.8 * _loss(saved, tiny_model, shared_data_root)


def _loss(tokenizer, model, data_root) -> float:
    """The completion-only loss of `model` on the rows the stage trained on."""
    from qerl.data.benchmarks import load_benchmark
    from qerl.models.pretrain import _batch, encode_examples

    rows = sft_rows(load_benchmark("gsm8k", data_root, split="train", limit=2))
    ids, attn, labels = _batch(encode_examples(rows, tokenizer, "paper"), model.config.pad_token_id)
    with torch.no_grad():
        return float(model(input_ids=ids, attention_mask=attn, labels=labels).loss)


def test_sft_off_is_an_error(tmp_path, shared_data_root):
    with pytest.raises(ValueError, match="sft.steps"):
        run_sft(_cfg(shared_data_root, steps=0), tmp_path, tmp_path / "out", device="cpu")
