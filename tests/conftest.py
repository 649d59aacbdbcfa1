"""Shared fixtures: the real benchmark files (../shared/data beside the checkout, or $QERL_TEST_DATA_ROOT); the
tiny config trimmed for DAG-level tests; the markers `gpu` (needs a CUDA device) and `triton_device` (needs a GPU,
or Triton's CPU interpreter) skip where they cannot run.

Run the suite as CI does: `make test` (pytest-xdist, two workers, whole files per worker: `-n 2 --dist loadfile
--no-loadscope-reorder`); plain `python -m pytest -q` runs the same tests in one process. Under xdist a module or
session fixture runs once per worker that needs it, so a fixture shared by several tests lives in their one file.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
import yaml

# Triton reads TRITON_INTERPRET when a kernel module is first imported, which may happen in any test package (the
# layers import qerl_kernels/); without a GPU the kernels run in Triton's interpreter.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

REPO = Path(__file__).resolve().parents[1]


# The files that run Snakemake DAGs or whole trainings, longest first (seconds under `make test` on 2 Intel Xeon
# cores: ~105, 80, 35, 20, 20). Under xdist a worker takes the next file in collection order when it runs low;
# starting these first keeps the other worker busy with the short files instead of leaving one of them for the end
# (test_workflow.py, last in collection order, left one worker 33 s of it alone). A renamed file only loses its
# place here (nothing fails).
LONGEST_FIRST = ("test_dag_e2e.py", "test_small_smoke.py", "test_workflow.py",
                 "rl/test_trainer.py", "rl/test_distributed.py")


def _file_rank(item) -> int:
    path = item.path.as_posix()
    return next((i for i, name in enumerate(LONGEST_FIRST) if path.endswith("/tests/" + name)), len(LONGEST_FIRST))


def pytest_configure(config):
    # An xdist worker shares the two cores with the other worker (and with the Snakemake jobs of the DAG tests):
    # one intra-op thread each; the tests that depend on the thread count set it themselves.
    if os.environ.get("PYTEST_XDIST_WORKER"):
        torch.set_num_threads(1)


def pytest_collection_modifyitems(config, items):
    items.sort(key=_file_rank)  # stable: the order inside a file and among the other files is kept
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


# The tiny tokenizer and Qwen2, built in code (tests/evaluate and tests/policy use them).
@pytest.fixture(scope="session")
def tokenizer():
    from qerl.models.tiny import build_tokenizer

    return build_tokenizer()


@pytest.fixture()
def tiny_model(tokenizer):
    from qerl.models.tiny import build_model

    return build_model(tokenizer, seed=0).eval()


@pytest.fixture(scope="session")
def tiny_base(tmp_path_factory) -> Path:
    """A base checkpoint folder: the random tiny Qwen2 (seed 0) and its tokenizer, as `--base` takes it (tests/rl;
    read-only: a test that writes beside it copies it first)."""
    from qerl.models.tiny import build_model, build_tokenizer

    base = tmp_path_factory.mktemp("tiny_base") / "base"
    tok = build_tokenizer()
    build_model(tok, seed=0).save_pretrained(base)
    tok.save_pretrained(base)
    return base


# The tiny scale cut to seconds per job, for tests that run the DAG through Snakemake (`rule all` of it takes minutes).
# Every job of the DAG still runs; what the jobs compute is not checked for quality, only that it is written and read:
# 10 pretraining steps of 8 sequences on one thread (the serial head of the DAG; `pretrain-tiny` sets its thread count
# from the config, not from Snakemake's --max-threads: its 2 threads beside the other pytest-xdist worker took 15 s
# where one takes 1-2) and 2 test problems per level (each evaluation and each training job's own evaluation) are
# enough for that.
TRIMMED = {
    "seeds": [0],
    "data": {"tiny": {"n_pretrain": 640, "n_rl": 200, "n_test_per_level": 2}},
    "tiny_model": {"pretrain": {"steps": 10, "warmup_steps": 2, "eval_per_level": 2, "batch_size": 8, "threads": 1}},
    "quantize": {"awq_grid": 4, "heldout_sequences": 4, "calibration": {"n_sequences": 8, "seq_len": 64}},
    "evaluate": {"n_repeats": 1},
    "train": {"methods": ["lora", "qlora", "nvfp4_lora", "qerl"], "steps": 2, "prompts_per_step": 2,
              "checkpoint_every": 1,
              "tasks": {"tiny_grpo": {"source": "tiny", "algorithm": "grpo", "group_size": 2, "max_new_tokens": 12},
                        "tiny_dapo": {"source": "tiny", "algorithm": "dapo", "group_size": 2, "max_new_tokens": 12,
                                      "dynamic_sampling": True, "methods": ["lora", "nvfp4_lora", "qerl"]}},
              "ablations": {"aqn_schedules": ["cosine"], "ranks": [8], "lrs": [1.0e-3], "lr_methods": ["qerl"]}},
}


def _merge(base, top):
    for key, value in top.items():
        base[key] = _merge(base.get(key, {}), value) if isinstance(value, dict) and key != "tasks" else value
    return base


@pytest.fixture(scope="session")
def trimmed_config(repo_root):
    """`trimmed_config(results_dir)`: config/config.yaml with TRIMMED merged in, writing under `results_dir`."""
    def make(results_dir) -> dict:
        cfg = _merge(yaml.safe_load((repo_root / "config" / "config.yaml").read_text()), TRIMMED)
        cfg["results_dir"] = str(results_dir)
        return cfg
    return make
