"""Fixtures of the policy-core tests: the tiny tokenizer and Qwen2 (tests/conftest.py) saved as a checkpoint folder."""
from __future__ import annotations

import pytest
import torch


@pytest.fixture(scope="session", autouse=True)
def _one_thread():
    torch.set_num_threads(1)


@pytest.fixture()
def base_dir(tmp_path, tokenizer, tiny_model):
    path = tmp_path / "base"
    tiny_model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path
