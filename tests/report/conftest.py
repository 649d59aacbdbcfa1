"""Synthetic results for the report tests: every run, evaluation and (optionally) measured file the registry names.

Values are deterministic functions of (method, variant, seed) so the tests can recompute means and stds by hand.
"""
from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from qerl.config import validate_config
from qerl.contract.records import METRIC_FIELDS
from qerl.report.registry import ARTIFACTS, input_files

N_STEPS = 40
ACC = {"full": 60.0, "lora": 50.0, "qlora": 48.0, "mxfp4_lora": 49.0, "nvfp4_lora": 52.0, "qerl": 55.0,
       "bf16": 30.0, "nf4": 27.0, "mxfp4": 28.0, "nvfp4": 29.0}
SEED_OFFSET = {0: -3.0, 1: -1.0, 2: 4.0}  # qerl on tiny_grpo: 52, 54, 59 -> mean 55.0, std sqrt(13) = 3.606


def make_config(results: Path) -> dict:
    """A tiny-scale config whose results live under `results`, with both task roles and small ablations."""
    raw = {
        "scale": "tiny",
        "results_dir": str(results),
        "seeds": [0, 1, 2],
        "model": {"name": "tiny"},
        "train": {
            "tasks": {"tiny_grpo": {"source": "tiny", "algorithm": "grpo", "group_size": 8, "updates_per_rollout": 4},
                      "tiny_dapo": {"source": "tiny", "algorithm": "dapo", "group_size": 16,
                                    "updates_per_rollout": 1}},
            "ablations": {"seeds": [0, 1], "ranks": [16, 32], "lrs": [5e-6, 3e-5],
                          "aqn_schedules": ["linear", "exponential", "cosine", "logarithmic"]},
        },
        "evaluate": {"benchmarks": ["tiny"], "methods": ["bf16", "nf4", "mxfp4", "nvfp4"]},
    }
    return validate_config(raw, source="test config", check_data=False)


def _metrics_lines(method: str, variant: str, seed: int) -> str:
    bump = {"qerl": 0.1, "lora": 0.0}.get(method, 0.05) + (0.02 if variant != "default" else 0.0)
    lines = []
    for step in range(N_STEPS):
        row = {"step": step, "reward": 0.2 + bump + 0.01 * step + 0.02 * seed + 0.03 * ((step * 7) % 3 - 1),
               "accuracy": 0.3 + 0.005 * step, "entropy": 0.3 - 0.004 * step + bump / 10, "sigma": 0.01 * 0.9 ** step,
               "response_length": 40.0 + step, "clip_fraction": 0.1, "kl": None, "grad_norm": 1.0,
               "time_rollout": 2.0, "time_logprobs": 0.5, "time_update": 1.0, "peak_memory_bytes": 10 ** 8,
               "rollout_tokens": 1000 + 100 * seed, "mismatch_kl": (1e-5 if "aqn" in variant or method == "qerl"
                                                                    else 1e-13) * (1 + step),
               "is_ratio_mean": 1.0, "is_ratio_max": 1.1, "is_ratio_p99": 1.05, "loss": 0.01, "grad_clipped": 0.0,
               "mixed_groups": 0.5, "adv_abs": 0.8, "lr": 1e-3, "skipped_updates": 0, "kept_fraction": 1.0,
               "truncated_fraction": 0.0, "rollout_tokens_per_s": 500.0 + 50 * seed}
        lines.append(json.dumps({k: row[k] for k in METRIC_FIELDS}))  # every field of the contract, in its order
    return "\n".join(lines) + "\n"


def _levels(value: float) -> dict:
    return {str(lv): {"pass_at_1": value + 10 - 5 * lv, "stderr": 1.0} for lv in range(1, 6)}


def _record(value: float, stderr: float | None) -> dict:
    """A benchmark record in the evaluator's spelling (qerl.contract.records.BenchmarkRecord's fields)."""
    return {"pass_at_1": value, "stderr": stderr, "pass_at_1_strict": value - 2.0, "stderr_strict": stderr,
            "n_problems": 500, "n_repeats": 4, "per_level": _levels(value)}


def write_inputs(cfg: dict) -> None:
    """Write every run/eval file that any artifact, or the claims, needs under cfg's results_dir."""
    from qerl.report.claims import claims_inputs

    files = [f for artifact in ARTIFACTS.values() for f in input_files(artifact, cfg)] + claims_inputs(cfg)
    for path in map(Path, dict.fromkeys(files)):
        if path.exists() or "measured" in path.parts:
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        seed = int(path.parent.name[4:]) if path.parent.name.startswith("seed") else int(path.stem[4:])
        if path.name == "metrics.jsonl":
            variant, method = path.parts[-3], path.parts[-4]
            path.write_text(_metrics_lines(method, variant, seed))
            (path.parent / "run.json").write_text(json.dumps(
                {"settings": {}, "provenance": {"commit": "abc1234", "hardware": {"cpu": "Test CPU"}}}))
        elif path.name == "eval.json":
            method, task = path.parts[-4], path.parts[-6]
            value = ACC[method] + SEED_OFFSET[seed] + (0.0 if task == "tiny_grpo" else -10.0)
            path.write_text(json.dumps({"benchmarks": {"tiny": _record(value, 1.0)}, "config": {},
                                        "provenance": {"commit": "abc1234", "hardware": "CPU test"}}))
        else:  # untrained evaluation
            method = path.parts[-3]
            value = ACC[method] + SEED_OFFSET[seed]
            path.write_text(json.dumps({"benchmarks": {"tiny": _record(value, None)}, "environment": {}}))


def write_measured(results: Path, gpu: str = "h100") -> Path:
    """Committed-style measured files for 7B (Table 6, Fig. 1, Fig. 11, Table 3)."""
    folder = results / "measured" / gpu
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "rollout.csv").write_text(
        "model,method,rank,batch,tokens_per_s\n"
        "Qwen2.5-7B-Instruct,lora,16,1,100\nQwen2.5-7B-Instruct,qerl,16,1,150\nQwen2.5-7B-Instruct,qerl,32,1,140\n"
        "Qwen2.5-7B-Instruct,lora,16,2,110\nQwen2.5-7B-Instruct,qerl,16,2,143\n"
        "Qwen2.5-7B-Instruct,lora,16,8,1600\nQwen2.5-7B-Instruct,qerl,16,8,2000\n")
    (folder / "e2e.csv").write_text(
        "model,method,batch,gradient_checkpointing,step_s\n"
        "Qwen2.5-7B-Instruct,lora,2,false,10\nQwen2.5-7B-Instruct,qerl,2,false,8\n"
        "Qwen2.5-7B-Instruct,qlora,2,false,12.5\nQwen2.5-7B-Instruct,lora,8,false,OOM\n"
        "Qwen2.5-7B-Instruct,qerl,8,false,20\nQwen2.5-7B-Instruct,lora,2,true,12\n"
        "Qwen2.5-7B-Instruct,qerl,2,true,10\n")
    (folder / "memory.csv").write_text(
        "model,method,model_size_gb,peak_gb\n"
        "Qwen2.5-7B-Instruct,lora,15.23,40.1\nQwen2.5-7B-Instruct,qerl,5.91,20.5\nQwen2.5-7B-Instruct,qlora,5.7,21\n")
    (folder / "provenance.json").write_text(json.dumps({"gpu": "NVIDIA H100 80GB HBM3", "commit": "def5678"}))
    return folder


@pytest.fixture(scope="session")
def synthetic(tmp_path_factory):
    """(cfg, results root) with every run/eval input written and no measured files."""
    results = tmp_path_factory.mktemp("results")
    cfg = make_config(results)
    write_inputs(cfg)
    return cfg, results


@pytest.fixture(scope="session")
def helpers():
    """The builders above, for tests that need their own results folder (no import of this module needed)."""
    return SimpleNamespace(make_config=make_config, write_inputs=write_inputs, write_measured=write_measured)
