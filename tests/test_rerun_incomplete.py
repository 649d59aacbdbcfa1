"""No metrics are lost when Snakemake reruns a training job that was killed.

A DAG killed while a training job evaluates leaves its outputs flagged incomplete; `snakemake --rerun-incomplete`
(both shipped profiles set it) deletes them, metrics.jsonl included, but not checkpoint.pt, which is deliberately
not an output. The rerun job resumes from that checkpoint and must still end with every step's metrics line.
The kill is a real SIGKILL of snakemake and of the job, placed at the in-job evaluation (tests/kill_in.py).
The CLI-level kill (`qerl train` killed in a step, metrics.jsonl deleted) is tests/rl/test_trainer.py's.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

SNAKEMAKE = str(Path(sys.executable).with_name("snakemake"))
ENV = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}


@pytest.mark.slow
def test_rerun_incomplete_after_kill_in_evaluation_keeps_metrics(repo_root, tmp_path, trimmed_config):
    cfg = trimmed_config(tmp_path / "results")
    cfg["data"]["tiny"].update(n_pretrain=300, n_rl=50, n_test_per_level=2)  # one run: cut further still
    cfg["tiny_model"]["pretrain"].update(steps=5, warmup_steps=1, eval_per_level=2)
    cfg["evaluate"]["methods"] = ["bf16"]
    cfg["train"]["methods"] = ["lora"]
    cfg["train"]["tasks"] = {"tiny_grpo": cfg["train"]["tasks"]["tiny_grpo"]}
    # no job server: each of the two runs with jobs would pay its ~6 CPU-seconds of imports, and no job of them
    # would reach it (it takes jobs only once its imports are done; the killed `qerl train` is tests/kill_in.py)
    cfg["resources"]["job_server"] = False
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(cfg, sort_keys=False))
    run = tmp_path / "results/tiny/runs/tiny_grpo/tiny/lora/default/seed0"
    # -d: Snakemake's own state (.snakemake/, its incomplete markers) stays in tmp_path, not in the checkout
    command = [SNAKEMAKE, str(run / "eval.json"), "-s", str(repo_root / "Snakefile"), "-d", str(tmp_path),
               "--cores", "1", "--configfile", str(config)]
    # First run: the training job's `qerl train` kills snakemake, then itself, when it starts its evaluation.
    bin_dir, pidfile = tmp_path / "bin", tmp_path / "snakemake.pid"
    bin_dir.mkdir()
    (bin_dir / "qerl").write_text(
        "#!/bin/sh\n"
        f'if [ "$1" = train ]; then exec "{sys.executable}" "{repo_root / "tests" / "kill_in.py"}" '
        f'qerl.evaluate.run:evaluate_model 0 "{pidfile}" "$@"; fi\n'
        f'exec "{sys.executable}" -m qerl.cli "$@"\n')
    (bin_dir / "qerl").chmod(0o755)
    first = subprocess.run(["/bin/sh", "-c", 'echo $$ > "$0"; exec "$@"', str(pidfile), *command],
                           capture_output=True, text=True, timeout=600,
                           env={**ENV, "PATH": f"{bin_dir}{os.pathsep}{ENV['PATH']}"})
    assert first.returncode == -signal.SIGKILL, (first.stdout + first.stderr)[-3000:]
    written = (run / "metrics.jsonl").read_text()
    assert len(written.splitlines()) == 2 and not (run / "eval.json").exists()
    # The killed snakemake left its lock, and the job's outputs flagged incomplete: a plain rerun refuses.
    subprocess.run(command + ["--unlock"], capture_output=True, text=True, timeout=600, env=ENV, check=True)
    plain = subprocess.run(command, capture_output=True, text=True, timeout=600, env=ENV)
    assert plain.returncode != 0 and "--rerun-incomplete" in plain.stdout + plain.stderr
    # As the profiles run it: Snakemake deletes the incomplete metrics.jsonl and reruns the job.
    second = subprocess.run(command + ["--rerun-incomplete"], capture_output=True, text=True, timeout=600, env=ENV)
    assert second.returncode == 0, (second.stdout + second.stderr)[-3000:]
    assert (run / "metrics.jsonl").read_text() == written  # the whole history, byte for byte
    assert (run / "eval.json").exists()
    # the job of all lora runs (resources.train.group_runs: default and the beyond-the-paper aqn-exponential)
    log = (tmp_path / "results/tiny/logs/train/tiny_grpo/tiny/lora/all-runs.log").read_text()
    assert "resumed from" in log and "at step 2 of 2" in log
