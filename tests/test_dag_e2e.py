"""The whole DAG end to end at a trimmed tiny size: every table and figure is produced, non-empty, every table
has the paper's column beside ours, and the claim-by-claim comparison is written. Minutes on 2 cores (the default
tiny scale itself is `make reproduce`)."""
from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from qerl.report.registry import ARTIFACTS

SNAKEMAKE = str(Path(sys.executable).with_name("snakemake"))
# the jobs call the `qerl` console script of this interpreter's environment, active or not
ENV = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}


@pytest.mark.slow
def test_trimmed_tiny_dag_builds_every_artifact(repo_root, tmp_path, trimmed_config):
    cfg = trimmed_config(tmp_path / "results")
    path = tmp_path / "trimmed.yaml"
    path.write_text(yaml.safe_dump(cfg))
    proc = subprocess.run([SNAKEMAKE, "--cores", "2", "--nolock", "--configfile", str(path)], cwd=repo_root,
                          capture_output=True, text=True, timeout=1500, env=ENV)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    out = tmp_path / "results" / "tiny"
    for name in ARTIFACTS:
        suffixes = (".md", ".tex", ".csv") if name.startswith("table") else (".png", ".pdf")
        folder = out / ("tables" if name.startswith("table") else "figures")
        for suffix in suffixes:
            f = folder / f"{name}{suffix}"
            assert f.exists() and f.stat().st_size > 0, f
        if name.startswith("table"):
            lines = [line for line in open(folder / f"{name}.csv") if not line.startswith("#")]
            header = next(csv.reader(lines))
            assert any(h.startswith("paper") for h in header), (name, header)
            assert any(h.startswith("ours") for h in header), (name, header)
    metrics = (out / "runs/tiny_grpo/tiny/qerl/default/seed0/metrics.jsonl").read_text().splitlines()
    assert len(metrics) == 2
    assert (out / "runs/tiny_dapo/tiny/qerl/default/seed0/eval.json").exists()
    assert not (out / "runs/tiny_dapo/tiny/qlora").exists()  # the DAPO task trains its own methods only
    claims = (out / "claims.md").read_text()
    assert all(f"\n## {n}. " in claims for n in range(1, 6)), claims[:2000]
