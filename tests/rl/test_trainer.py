"""The RL trainer end to end on CPU at a toy size: every method trains, resume is exact, NaN losses abort."""
from __future__ import annotations

import json

import pytest
import torch

from qerl.config import validate_config
from qerl.data.tiny import write_splits
from qerl.models.pretrain import encode_examples, pretrain
from qerl.models.tiny import build_model, build_tokenizer
from qerl.rl import trainer as T

TIMING = {"time_rollout", "time_logprobs", "time_update", "peak_memory_bytes", "rollout_tokens_per_s"}


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny")
    write_splits(root / "data", 0, 600, 200, 4, [1, 2])
    tok = build_tokenizer()
    model = build_model(tok, seed=0)
    rows = [json.loads(l) for l in (root / "data" / "pretrain.jsonl").read_text().splitlines()]
    pretrain(model, encode_examples(rows, tok, "none"), steps=40, time_budget_s=300, batch_size=32, lr=3e-3,
             warmup_steps=5, weight_decay=0.0, seed=0)
    model.save_pretrained(root / "base")
    tok.save_pretrained(root / "base")
    cfg = validate_config({
        "prompt": {"instruction": "none"},
        "train": {"steps": 4, "prompts_per_step": 2, "checkpoint_every": 2, "lr": 1e-3, "lr_by_method": {},
                  "lora": {"rank": 4, "alpha": 8},
                  "aqn": {"stages": 2, "sigma_start": 0.05, "sigma_end": 0.01},
                  "tasks": {"t": {"source": "tiny", "algorithm": "grpo", "group_size": 4, "updates_per_rollout": 2,
                                  "max_new_tokens": 10},
                            "d": {"source": "tiny", "algorithm": "dapo", "group_size": 4, "updates_per_rollout": 1,
                                  "max_new_tokens": 10, "dynamic_sampling": True, "overlong_filter": True}}},
    })
    return cfg, root


def _run(setup, tmp_path, method, task="t", variant="default", **kw):
    cfg, root = setup
    s = T.resolve_settings(cfg, task, method, variant, seed=0)
    return T.train(cfg, s, root / "base", tmp_path / "run", data_dir=root / "data", progress=False, **kw), tmp_path / "run"


def _metrics(run_dir):
    return [json.loads(l) for l in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("method", ["full", "lora", "mxfp4_lora", "nvfp4_lora", "qerl", "qlora"])
def test_every_method_trains(setup, tmp_path, method):
    if method == "qlora":
        from baselines.nf4 import bitsandbytes_cpu_problem

        if bitsandbytes_cpu_problem():
            pytest.skip(bitsandbytes_cpu_problem())
    result, run_dir = _run(setup, tmp_path, method)
    rows = _metrics(run_dir)
    assert [r["step"] for r in rows] == [0, 1, 2, 3]
    assert set(T.METRIC_KEYS) <= set(rows[0])
    assert all(torch.isfinite(torch.tensor(r["grad_norm"])) for r in rows)
    weights = run_dir / ("model" if method == "full" else "adapter")
    assert weights.is_dir() and any(weights.iterdir())
    sigmas = [r["sigma"] for r in rows]
    if method == "qerl":
        assert sigmas[0] == 0.0 and sigmas[-1] > 0  # stage 0 adds nothing (Alg. 1), stage 1 adds sigma_start
    else:
        assert sigmas == [0.0] * 4


def test_dapo_task_trains(setup, tmp_path):
    _, run_dir = _run(setup, tmp_path, "qerl", task="d")
    assert len(_metrics(run_dir)) == 4


def test_resume_is_exact(setup, tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    full, dir_a = _run(setup, tmp_path / "a", "qerl")
    part, dir_b = _run(setup, tmp_path / "b", "qerl", stop_after=2)
    assert len(_metrics(dir_b)) == 2 and (dir_b / "checkpoint.pt").exists()
    resumed, _ = _run(setup, tmp_path / "b", "qerl")
    strip = lambda rows: [{k: v for k, v in r.items() if k not in TIMING} for r in rows]
    assert strip(_metrics(dir_a)) == strip(_metrics(dir_b))
    pa = {n: p for n, p in full["model"].named_parameters() if p.requires_grad}
    pb = {n: p for n, p in resumed["model"].named_parameters() if p.requires_grad}
    assert pa.keys() == pb.keys() and all(torch.equal(pa[n], pb[n]) for n in pa)


def test_nan_losses_abort(setup, tmp_path, monkeypatch):
    real = T.grpo_loss

    def nan_loss(*a, **k):
        loss, diag = real(*a, **k)
        return loss * float("nan"), diag

    monkeypatch.setattr(T, "grpo_loss", nan_loss)
    with pytest.raises(RuntimeError, match="consecutive steps had a NaN/Inf loss"):
        _run(setup, tmp_path, "lora")


@pytest.mark.parametrize("variant, expected", [("default", {}), ("noaqn", {"aqn": False}),
                                               ("aqn-cosine", {"aqn_schedule": "cosine"}), ("rank16", {"lora_rank": 16}),
                                               ("lr3e-05", {"lr": 3e-5})])
def test_variants(variant, expected):
    assert T.parse_variant(variant) == expected


def test_bad_variant_and_task(setup):
    cfg, _ = setup
    with pytest.raises(ValueError, match="unknown variant"):
        T.parse_variant("rnak8")
    with pytest.raises(ValueError, match="unknown task 'nope'"):
        T.resolve_settings(cfg, "nope", "qerl", "default", 0)
    with pytest.raises(ValueError, match="nothing to train"):
        T.resolve_settings(cfg, "t", "nvfp4", "default", 0)


def test_rank_variant_keeps_lora_scale(setup):
    cfg, _ = setup
    s = T.resolve_settings(cfg, "t", "qerl", "rank8", 0)
    assert s.lora_rank == 8 and s.lora_alpha / s.lora_rank == 2.0
