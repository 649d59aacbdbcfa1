"""Both transformers API generations the harness runs on: 5.24+ (CPU CI) and 5.17 (the GPU image).
Run: `python -m pytest -q tests/rl/test_transformers_compat.py`."""
from __future__ import annotations

import torch

from qerl.policy.core import set_gradient_checkpointing
from qerl.rl.rollout import kv_cache_arg


class _New(torch.nn.Module):
    def forward(self, input_ids=None, cache=None, use_cache=None):  # transformers >= 5.24
        return input_ids


class _Old(torch.nn.Module):
    def forward(self, input_ids=None, past_key_values=None, use_cache=None):  # transformers 5.17
        return input_ids


class _Wrapped(torch.nn.Module):  # a peft-style wrapper: the base model's forward decides
    def __init__(self, base):
        super().__init__()
        self.base = base

    def get_base_model(self):
        return self.base


def test_kv_cache_argument_follows_the_installed_api(tiny_model):
    assert kv_cache_arg(_New()) == "cache" and kv_cache_arg(_Old()) == "past_key_values"
    assert kv_cache_arg(_Wrapped(_Old())) == "past_key_values"
    assert kv_cache_arg(tiny_model) in ("cache", "past_key_values")  # whatever this transformers has


def test_checkpointing_uses_whichever_api_exists():
    calls = []

    class Old(torch.nn.Module):
        def gradient_checkpointing_enable(self, gradient_checkpointing_kwargs=None):
            calls.append(("enable", gradient_checkpointing_kwargs))

        def gradient_checkpointing_disable(self):
            calls.append(("disable", None))

    set_gradient_checkpointing(Old(), True)
    set_gradient_checkpointing(Old(), False)
    assert calls == [("enable", {"use_reentrant": False}), ("disable", None)]
