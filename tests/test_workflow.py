"""The Snakefile: the default config lists every stage's jobs, a bad config fails before any job, lint is clean."""
from __future__ import annotations

import os
import re
import shutil
import sys
from pathlib import Path

import pytest
import yaml

from tests.snakemake_cli import snakemake

# the jobs call the `qerl` console script of this interpreter's environment, active or not
ENV = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}


def _snakemake(repo_root, *args):
    return snakemake(["--nolock", *args], cwd=repo_root, timeout=300, env=ENV)


@pytest.mark.slow
def test_dry_run_lists_every_stage(repo_root, tmp_path):
    cfg = yaml.safe_load((repo_root / "config" / "config.yaml").read_text())
    cfg["results_dir"] = str(tmp_path / "results")
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(cfg))
    proc = _snakemake(repo_root, "-n", "--configfile", str(path))
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = proc.stdout + proc.stderr
    for rule in ("effective_config", "gen_tiny", "pretrain_tiny", "calibrate", "quantize", "evaluate",
                 "train_tiny_grpo_qerl", "table1", "fig8"):
        assert f"rule {rule}:" in out, rule
    # resources.train.group_runs (the tiny scale): one job per (task, method) trains its runs, one job per format
    # evaluates the seeds; the same runs and files as one job each
    grouped = _job_counts(out)
    assert grouped["train_tiny_grpo_qerl"] == 1 and grouped["evaluate"] == len(cfg["evaluate"]["methods"])
    assert "/tiny/qerl/all-runs.log" in out and "/logs/evaluate/tiny/nvfp4/tiny/seed0-1-2.log" in out
    # the quantization jobs start before every training job (workflow/rules/quantize.smk, QUANTIZE_PRIORITY); a
    # grouped training job's priority is its number of runs (the longest first)
    priority = _priorities(out)
    training = [p for rule, ps in priority.items() if rule.startswith("train") for p in ps]
    assert min(priority["calibrate"] + priority["quantize"]) > max(training) > len(cfg["seeds"])
    # a two-thread calibration outweighs any pair of one-thread jobs the scheduler could start instead (it
    # maximizes the sum of the started jobs' priorities): a quantize job beside a training job, or two quantize jobs
    assert min(priority["calibrate"]) > max(priority["quantize"]) + max(max(training), max(priority["quantize"]))
    assert not (tmp_path / "results").exists()  # a dry run writes nothing, not even the effective config
    cfg["resources"] = {"train": {"group_runs": False}}
    path.write_text(yaml.safe_dump(cfg))
    proc = _snakemake(repo_root, "-n", "--configfile", str(path))
    assert proc.returncode == 0, proc.stderr[-2000:]
    single_out = proc.stdout + proc.stderr
    single = _job_counts(single_out)
    runs = set(re.findall(r"\S+/runs/\S+/eval\.json", out))
    assert runs == set(re.findall(r"\S+/runs/\S+/eval\.json", single_out)) and single["train"] == len(runs)
    assert sum(n for rule, n in grouped.items() if rule.startswith("train")) < len(runs) // 3
    assert single["evaluate"] == len(cfg["seeds"]) * grouped["evaluate"]


def _priorities(out: str) -> dict[str, list[int]]:
    """The dry run's job priorities, {rule: [priority of each job]} (0 where a job block names none)."""
    found: dict[str, list[int]] = {}
    for block in re.split(r"\n(?=(?:local)?rule \w+:)", out)[1:]:
        rule = re.match(r"(?:local)?rule (\w+):", block).group(1)
        value = re.search(r"^\s+priority: (\d+)$", block, re.M)
        found.setdefault(rule, []).append(int(value.group(1)) if value else 0)
    return found


def _job_counts(out: str) -> dict[str, int]:
    """The dry run's job-stats table: {rule: jobs}."""
    counts = {}
    for line in out[out.index("Job stats:"):].splitlines()[3:]:
        if not line.strip():
            break
        rule, n = line.split()
        counts[rule] = int(n)
    return counts


@pytest.mark.slow
def test_effective_config_is_written_by_jobs_and_edits_rerun_only_readers(repo_root, tmp_path, trimmed_config):
    """R/config.yaml, the effective config every job reads, is written when jobs run: by rule effective_config when
    it is missing, brought up to date before the first job otherwise; a dry run writes nothing; an edit of one
    section reruns the jobs reading it and no other; `--config` reaches the file; it is refreshed even when
    Snakemake has no record of how it was made (as after an older version of the workflow)."""
    cfg = trimmed_config(tmp_path / "results")
    # no job server: its ~7 CPU-seconds of imports, paid by each of the runs below, would serve gen-tiny alone,
    # whose own imports take under a second
    cfg["resources"]["job_server"] = False
    path = tmp_path / "c.yaml"
    results = tmp_path / "results" / "tiny"
    rl = results / "data" / "tiny" / "rl.jsonl"  # gen_tiny's output; gen_tiny reads section `data` only

    def smk(*args, target=rl):
        path.write_text(yaml.safe_dump(cfg))
        proc = _snakemake(repo_root, "-s", str(repo_root / "Snakefile"), "-d", str(tmp_path), "--cores", "1",
                          str(target), *args, "--configfile", str(path))
        assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
        return proc.stdout + proc.stderr

    def written():
        return yaml.safe_load((results / "config.yaml").read_text())

    out = smk("-n")
    assert "rule effective_config:" in out and "rule gen_tiny:" in out and not (tmp_path / "results").exists()
    smk()
    assert written()["results_dir"] == cfg["results_dir"] and written()["evaluate"]["n_repeats"] == 1
    stamp = rl.stat().st_mtime_ns

    cfg["evaluate"]["n_repeats"] = 3  # a section gen_tiny does not read: nothing to rerun
    assert "Nothing to be done" in smk("-n")
    cfg["data"]["tiny"]["n_rl"] = 100  # a section it reads: gen_tiny reruns, with the file brought up to date
    out = smk("-n")
    assert "rule gen_tiny:" in out and "rule effective_config:" not in out, out[-3000:]
    assert written()["data"]["tiny"]["n_rl"] == 200  # the dry run wrote nothing
    smk()
    assert rl.stat().st_mtime_ns != stamp and len(rl.read_text().splitlines()) <= 100
    assert (written()["data"]["tiny"]["n_rl"], written()["evaluate"]["n_repeats"]) == (100, 3)

    other = tmp_path / "other"  # --config key=value reaches the file every job reads
    smk("--config", f"results_dir={other}", target=other / "tiny" / "data" / "tiny" / "rl.jsonl")
    assert yaml.safe_load((other / "tiny" / "config.yaml").read_text())["results_dir"] == str(other)

    shutil.rmtree(tmp_path / ".snakemake" / "metadata")  # no record of any earlier job
    cfg["data"]["tiny"]["n_rl"] = 50
    rl.unlink()
    smk()
    assert written()["data"]["tiny"]["n_rl"] == 50 and len(rl.read_text().splitlines()) <= 50


@pytest.mark.slow
@pytest.mark.parametrize("bad, expected", [
    ({"train": {"stpes": 3}}, "unknown key(s) ['stpes'] under 'train'"),
    ({"train": {"methods": ["lora", "nf4"]}}, "key 'train.methods.1': value 'nf4' is not a trainable method"),
    ({"train": {"lr": "4e-4"}}, "key 'train.lr': value '4e-4' should be of type number; YAML reads an exponent"),
], ids=["unknown key", "untrainable method", "number as text"])
def test_bad_config_prints_one_line_not_the_schema(repo_root, tmp_path, bad, expected):
    """A bad config fails before any job (no results folder), in one line naming the file, the key and the value."""
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump({"results_dir": str(tmp_path / "r"), **bad}))
    proc = _snakemake(repo_root, "-n", "--configfile", str(path))
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and expected in out, out[-3000:]
    assert f"{path}: invalid config" in out  # names the file
    assert "Failed validating" not in out and len(out.splitlines()) < 10, out  # not the schema's ~570 lines
    assert not (tmp_path / "r").exists()


@pytest.mark.slow
def test_lint_is_clean(repo_root):
    proc = _snakemake(repo_root, "--lint")
    assert proc.returncode == 0 and "good condition" in proc.stdout + proc.stderr, (proc.stdout + proc.stderr)[-3000:]


@pytest.mark.slow
def test_profile_rule_passes_the_config(repo_root, tmp_path):
    cfg = yaml.safe_load((repo_root / "config" / "config.yaml").read_text())
    cfg["results_dir"] = str(tmp_path / "results")
    cfg["profile"] = {"archs": ["7B", "32B"], "ranks": [32], "completion_tokens": 512}
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(cfg))
    # the rule owns results/<scale>/measured/<gpu>/; results/measured/ (committed runs) is never its output
    target = str(tmp_path / "results" / cfg["scale"] / "measured" / "h100" / "rollout.csv")
    proc = _snakemake(repo_root, target, "-n", "-p", "--configfile", str(path))
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = proc.stdout + proc.stderr
    # the GRPO step it times is the trainer's, with this config's training settings
    assert (f"qerl profile --config {tmp_path}/results/{cfg['scale']}/config.yaml --archs 7B 32B --methods lora qlora "
            "qerl --ranks 32") in out
    folder = f"{tmp_path}/results/{cfg['scale']}/measured/h100"
    assert "--completion 512" in out and f"--out {folder}/partial --publish {folder}" in out


@pytest.mark.slow
def test_pretraining_takes_the_jobs_thread_allotment(repo_root, tmp_path):
    """`pretrain-tiny` runs on the threads Snakemake allots the job (the config's tiny_model.pretrain.threads, capped
    by --cores / --max-threads), not on the config's number regardless: its 2 threads beside another job on 2 cores
    cost the test suite 15 s."""
    cfg = yaml.safe_load((repo_root / "config" / "config.yaml").read_text())
    cfg["results_dir"] = str(tmp_path / "results")
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(cfg))
    target = str(tmp_path / "results" / cfg["scale"] / "models" / "tiny" / "base")
    assert cfg["tiny_model"]["pretrain"]["threads"] == 2
    for cap, want in (("2", 2), ("1", 1)):
        proc = _snakemake(repo_root, target, "-n", "-p", "--cores", "2", "--max-threads", cap,
                          "--configfile", str(path))
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert re.search(rf"qerl pretrain-tiny .* --threads {want} ", proc.stdout + proc.stderr), cap
