"""The Snakefile: the default config lists every stage's jobs, a bad config fails before any job, lint is clean."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

SNAKEMAKE = str(Path(sys.executable).with_name("snakemake"))
# the jobs call the `qerl` console script of this interpreter's environment, active or not
ENV = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}


def _snakemake(repo_root, *args):
    return subprocess.run([SNAKEMAKE, "--nolock", *args], cwd=repo_root, capture_output=True, text=True, timeout=300, env=ENV)


@pytest.mark.slow
def test_dry_run_lists_every_stage(repo_root, tmp_path):
    cfg = yaml.safe_load((repo_root / "config" / "config.yaml").read_text())
    cfg["results_dir"] = str(tmp_path / "results")
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(cfg))
    proc = _snakemake(repo_root, "-n", "--configfile", str(path))
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = proc.stdout + proc.stderr
    for rule in ("gen_tiny", "pretrain_tiny", "calibrate", "quantize", "evaluate", "train", "table1", "fig8"):
        assert f"rule {rule}:" in out, rule
    assert (tmp_path / "results" / "tiny" / "config.yaml").exists()  # the effective config every job reads


@pytest.mark.slow
def test_unknown_key_fails_before_any_job(repo_root, tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump({"results_dir": str(tmp_path / "r"), "train": {"stpes": 3}}))
    proc = _snakemake(repo_root, "-n", "--configfile", str(path))
    assert proc.returncode != 0
    assert "stpes" in proc.stdout + proc.stderr
    assert not (tmp_path / "r").exists()


@pytest.mark.slow
@pytest.mark.parametrize("bad, expected", [
    ({"train": {"stpes": 3}}, "unknown key(s) ['stpes'] under 'train'"),
    ({"train": {"methods": ["lora", "nf4"]}}, "key 'train.methods.1': value 'nf4' is not a trainable method"),
    ({"train": {"lr": "4e-4"}}, "key 'train.lr': value '4e-4' should be of type number; YAML reads an exponent"),
], ids=["unknown key", "untrainable method", "number as text"])
def test_bad_config_prints_one_line_not_the_schema(repo_root, tmp_path, bad, expected):
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
    assert "qerl profile --archs 7B 32B --methods lora qlora qerl --ranks 32" in out
    folder = f"{tmp_path}/results/{cfg['scale']}/measured/h100"
    assert "--completion 512" in out and f"--out {folder}/partial --publish {folder}" in out
