"""`qerl status` (qerl/status.py): every run of the config's grid with its state read from the files runs write,
Snakemake's locks and incomplete markers, a copied results folder, and the three output formats."""
from __future__ import annotations

import base64
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from qerl.config import load_config
from qerl.contract.grid import train_runs
from qerl.contract.paths import run_dir, train_group_log, train_log
from qerl.status import collect_status, format_json, format_table, format_tsv

REPO = Path(__file__).resolve().parents[1]


def _row(step, reward):
    return json.dumps({"step": step, "reward": reward, "time_rollout": 1.0, "time_logprobs": 0.25,
                       "time_update": 0.75})


def _record(p):
    return {"pass_at_1": p, "stderr": 1.0, "pass_at_1_strict": p, "stderr_strict": 1.0, "n_problems": 500,
            "n_repeats": 2, "per_level": {}}


@pytest.fixture
def folder(tmp_path):
    """A workflow folder with results/tiny holding runs in every state."""
    cfg = load_config(REPO / "config" / "config.yaml", check_data=False)
    R = "results/tiny"
    (tmp_path / R).mkdir(parents=True)
    (tmp_path / R / "config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    runs = train_runs(cfg)
    d = [tmp_path / run_dir(R, t, "tiny", m, v, s) for t, m, v, s in runs[:5]]
    for x in d:
        x.mkdir(parents=True)
    (d[0] / "metrics.jsonl").write_text("".join(_row(k, 0.5 + k / 100) + "\n" for k in range(16)))
    (d[0] / "eval.json").write_text(json.dumps({"benchmarks": {"tiny": _record(54.25)}}))
    (d[1] / "metrics.jsonl").write_text(_row(0, 0.1) + "\n" + _row(1, 0.2) + "\n" + '{"step": 2, "rew')  # torn line
    t, m, v, s = runs[2]
    log = tmp_path / train_log(R, t, "tiny", m, v, s)
    log.parent.mkdir(parents=True)
    log.write_text("step 3\nTraceback (most recent call last):\n  File x\nValueError: data/rl.jsonl:7: not valid JSON\n")
    for i in (3, 4):  # marked incomplete by Snakemake (running, or killed)
        marker = tmp_path / ".snakemake" / "incomplete" / base64.urlsafe_b64encode(
            f"{run_dir(R, *runs[i][:1], 'tiny', *runs[i][1:])}/metrics.jsonl".encode()).decode()
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.write_text("")
    (d[4] / "metrics.jsonl").write_text(_row(0, 0.3) + "\n")
    return tmp_path, cfg, runs


def test_states_steps_reward_and_pass(folder, monkeypatch):
    work, cfg, runs = folder
    monkeypatch.chdir(work)
    report = collect_status(cfg)
    assert [(r.task, r.method, r.variant, r.seed) for r in report.runs] == runs
    states = [r.state for r in report.runs]
    assert states[:5] == ["done", "stopped", "failed", "incomplete", "incomplete"]
    assert set(states[5:]) == {"not started"} and not report.locks
    done, stopped, failed = report.runs[:3]
    assert (done.steps_done, done.steps_total, done.reward, done.pass_at_1) == (16, 16, 0.65, {"tiny": 54.25})
    assert done.seconds_per_step == 2.0
    assert (stopped.steps_done, stopped.reward) == (2, 0.2)  # the torn line being written is not counted
    assert failed.detail == "ValueError: data/rl.jsonl:7: not valid JSON"
    table = format_table(report)
    assert "16/16" in table and "54.2" in table and f"{len(runs)} runs in results/tiny: 1 done" in table
    assert "failed: ValueError: data/rl.jsonl:7" in table and "locked" not in table


def test_a_lock_makes_marked_runs_running_and_is_named(folder, monkeypatch):
    work, cfg, runs = folder
    monkeypatch.chdir(work)
    (work / ".snakemake" / "locks").mkdir(parents=True)
    (work / ".snakemake" / "locks" / "0.output.lock").write_text(f"{run_dir('results/tiny', *runs[3][:1], 'tiny', *runs[3][1:])}/eval.json\n")
    report = collect_status(cfg)
    assert [r.state for r in report.runs[3:5]] == ["running", "running"]
    assert report.locks and "snakemake --unlock, then snakemake --cores all --rerun-incomplete" in format_table(report)
    (work / ".snakemake" / "locks" / "0.output.lock").write_text("elsewhere/file\n")
    assert not collect_status(cfg).locks  # a lock on another results folder


def test_copied_folder_through_the_cli_in_tsv_and_json(folder, tmp_path_factory):
    work, cfg, runs = folder
    copy = tmp_path_factory.mktemp("copy") / "tiny"
    shutil.copytree(work / "results" / "tiny", copy)  # no .snakemake: no markers, no locks
    out = subprocess.run([sys.executable, "-m", "qerl.cli", "status", "--results", str(copy), "--format", "json"],
                         capture_output=True, text=True, check=True, cwd=copy.parent).stdout
    report = json.loads(out)
    assert report["results"] == str(copy) and report["locks"] == []
    assert [r["state"] for r in report["runs"][:5]] == ["done", "stopped", "failed", "not started", "stopped"]
    tsv = format_tsv(collect_status(cfg, copy, copy.parent)).splitlines()
    assert tsv[0].split("\t") == ["task", "method", "variant", "seed", "steps", "reward", "pass@1", "s/step", "state",
                                  "detail"]
    assert tsv[1].split("\t")[4:9] == ["16/16", "0.650", "tiny:54.2", "2.00", "done"]
    assert len(tsv) == len(runs) + 1
    assert json.loads(format_json(collect_status(cfg, copy, copy.parent))) == report


def test_a_grouped_jobs_log_error_fails_its_unfinished_runs(folder, monkeypatch):
    """resources.train.group_runs: the runs of a (task, method) share one job log (all-runs.log), whose error marks
    every run of the group that has not finished as failed; the other groups' untouched runs stay not started."""
    work, cfg, runs = folder
    monkeypatch.chdir(work)
    first = {(t, m) for t, m, _, _ in runs[:5]}
    task, method = next((t, m) for t, m, _, _ in runs if (t, m) not in first)
    log = work / train_group_log("results/tiny", task, "tiny", method)
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text("step 1\nRuntimeError: CUDA out of memory\n")
    report = collect_status(cfg)
    group = [r for r in report.runs if (r.task, r.method) == (task, method)]
    assert group and {r.state for r in group} == {"failed"}
    assert {r.detail for r in group} == {"RuntimeError: CUDA out of memory"}
    assert {r.state for r in report.runs[5:] if (r.task, r.method) != (task, method)} == {"not started"}
