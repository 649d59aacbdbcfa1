"""Fixtures of the policy-core tests: the tiny tokenizer and Qwen2 (built in code), saved as a checkpoint folder."""
from __future__ import annotations

import pytest
import torch

from qerl.models.tiny import build_model, build_tokenizer


@pytest.fixture(scope="session", autouse=True)
def _one_thread():
    torch.set_num_threads(1)


@pytest.fixture(scope="session")
def tokenizer():
    return build_tokenizer()


@pytest.fixture()
def tiny_model(tokenizer):
    return build_model(tokenizer, seed=0).eval()


@pytest.fixture()
def base_dir(tmp_path, tokenizer, tiny_model):
    path = tmp_path / "base"
    tiny_model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path
