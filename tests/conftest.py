"""Shared fixtures: the real benchmark files (../shared/data beside the checkout, or $QERL_TEST_DATA_ROOT); the
markers `gpu` (needs a CUDA device) and `triton_device` (needs a GPU, or Triton's CPU interpreter) skip where
they cannot run."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

# Triton reads TRITON_INTERPRET when a kernel module is first imported, which may happen in any test package (the
# layers import kernels/); without a GPU the kernels run in Triton's interpreter.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

REPO = Path(__file__).resolve().parents[1]


def pytest_collection_modifyitems(config, items):
    cuda = torch.cuda.is_available()
    interpreter = os.environ.get("TRITON_INTERPRET") == "1"
    for item in items:
        if item.get_closest_marker("gpu") and not cuda:
            item.add_marker(pytest.mark.skip(reason="needs a CUDA device"))
        elif item.get_closest_marker("triton_device") and not (cuda or interpreter):
            item.add_marker(pytest.mark.skip(reason="needs a GPU or TRITON_INTERPRET=1"))


@pytest.fixture(scope="session")
def shared_data_root() -> Path:
    root = Path(os.environ.get("QERL_TEST_DATA_ROOT", REPO.parent / "shared" / "data"))
    if not (root / "gsm8k" / "test.jsonl").exists():
        pytest.skip(f"benchmark files not found under {root} (set QERL_TEST_DATA_ROOT)")
    return root


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO
