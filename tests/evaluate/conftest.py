"""Fixtures of the evaluation tests (the tiny tokenizer and Qwen2 are tests/conftest.py's): a small tiny-format
test file, a validated config, and a scripted model whose completions are known in advance (so graded numbers are
exact)."""
from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from qerl.config import validate_config
from qerl.data.tiny import generate_split


@pytest.fixture(scope="session", autouse=True)
def _one_thread():
    torch.set_num_threads(1)


@pytest.fixture(scope="session")
def tiny_test_file(tmp_path_factory):
    """12 generated problems, levels 1-3 (4 each), in the `gen_tiny` format."""
    path = tmp_path_factory.mktemp("tiny") / "test.jsonl"
    rows = generate_split(7, 12, [1, 2, 3], "test")
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture(scope="session")
def cfg():
    return validate_config({"evaluate": {"benchmarks": ["tiny"], "n_repeats": 2, "max_new_tokens": 8,
                                         "batch_size": 16}}, check_data=False)


class _Cache:
    """Stands in for a transformers KV cache: counts decoding steps, drops rows like the real one."""

    def __init__(self):
        self.step = 0

    def batch_select_indices(self, indices):
        pass


class ScriptedLM(nn.Module):
    """A 'model' that emits a fixed token script whatever the prompt; at steps listed in `choices` the given
    tokens are equally likely (so sampling, seeds and repeats can be checked against known outcomes)."""

    def __init__(self, script: list[int], vocab_size: int, eos_id: int, choices: dict[int, list[int]] | None = None):
        super().__init__()
        self.script, self.vocab_size, self.choices = script, vocab_size, choices or {}
        self.config = SimpleNamespace(max_position_embeddings=None, eos_token_id=eos_id)
        self.anchor = nn.Parameter(torch.zeros(1))

    def forward(self, input_ids, attention_mask=None, position_ids=None, cache=None, use_cache=True):
        if cache is None:
            cache = _Cache()
        else:
            cache.step += 1
        step = min(cache.step, len(self.script) - 1)
        logits = torch.full((input_ids.shape[0], input_ids.shape[1], self.vocab_size), -1e4)
        for tok in self.choices.get(step, [self.script[step]]):
            logits[:, -1, tok] = 0.0
        return SimpleNamespace(logits=logits, cache=cache)


@pytest.fixture()
def scripted(tokenizer):
    """Build a ScriptedLM from text: scripted("<think> 1 </think> <answer> 8 </answer>", choices={...})."""

    def make(text: str, choices: dict[int, list[str]] | None = None, eos: bool = True) -> ScriptedLM:
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        if eos:
            ids = ids + [tokenizer.eos_token_id]
        tok_choices = {k: [tokenizer.convert_tokens_to_ids(t) for t in v] for k, v in (choices or {}).items()}
        return ScriptedLM(ids, len(tokenizer), tokenizer.eos_token_id, tok_choices)

    return make
