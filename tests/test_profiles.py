"""The Snakemake profiles: the local one dry-runs (GPU jobs capped, launched through torchrun with claimed GPUs),
the SLURM one parses and dry-runs when its executor plugin is installed (`pip install -e .[cluster]`)."""
from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest
import yaml

from tests.snakemake_cli import snakemake

ENV = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}


def _config(repo_root: Path, tmp_path: Path, gpus: int) -> Path:
    cfg = yaml.safe_load((repo_root / "config" / "config.yaml").read_text())
    cfg["results_dir"] = str(tmp_path / "results")
    cfg["resources"] = {"train": {"gpus": gpus, "mem_mb": 64000, "runtime": 600}}
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def _dry_run(repo_root: Path, profile: str, config: Path) -> str:
    proc = snakemake(["--nolock", "-n", "-p", "--profile", f"workflow/profiles/{profile}", "--configfile", str(config)],
                     cwd=repo_root, timeout=300, env=ENV)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    return out


def _train_jobs(out: str) -> list[str]:
    return [block for block in out.split("rule ")[1:] if block.startswith("train:")]


@pytest.mark.slow
def test_local_profile_dry_run(repo_root, tmp_path):
    prof = yaml.safe_load((repo_root / "workflow" / "profiles" / "local" / "config.yaml").read_text())
    assert prof["cores"] == "all" and any(r.startswith("gpu=") for r in prof["resources"])
    jobs = _train_jobs(_dry_run(repo_root, "local", _config(repo_root, tmp_path, gpus=2)))
    assert jobs, "no train job in the dry run"
    for job in jobs:
        assert "gpu=2" in job and "mem_mb=64000" in job and "runtime=600" in job
        assert ("python -m qerl.rl.distributed --gpus 2 --slots 1 -- torchrun --standalone --nproc_per_node 2 "
                "-m qerl.cli train --config") in job
    cpu = _train_jobs(_dry_run(repo_root, "local", _config(repo_root, tmp_path, gpus=0)))
    assert cpu and all("Shell command: qerl train --config" in j and "torchrun" not in j for j in cpu)


def test_slurm_profile_parses(repo_root):
    prof = yaml.safe_load((repo_root / "workflow" / "profiles" / "slurm" / "config.yaml").read_text())
    assert prof["executor"] == "slurm"
    assert {"slurm_account", "slurm_partition", "mem_mb", "runtime"} <= set(prof["default-resources"])
    assert "slurm_partition" in prof["set-resources"]["train"]
    assert prof["jobs"] >= 1 and prof["latency-wait"] > 0 and prof["retries"] >= 1


@pytest.mark.slow
def test_slurm_profile_dry_run(repo_root, tmp_path):
    if importlib.util.find_spec("snakemake_executor_plugin_slurm") is None:
        pytest.skip("snakemake-executor-plugin-slurm is not installed (pip install -e .[cluster])")
    jobs = _train_jobs(_dry_run(repo_root, "slurm", _config(repo_root, tmp_path, gpus=2)))
    assert jobs and all("slurm_partition=YOUR_GPU_PARTITION" in j and "gpu=2" in j for j in jobs)
