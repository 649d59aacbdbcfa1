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

TRIMMED = {
    "seeds": [0],
    "data": {"tiny": {"n_pretrain": 2000, "n_rl": 200, "n_test_per_level": 6}},
    "tiny_model": {"pretrain": {"steps": 40, "warmup_steps": 5, "eval_per_level": 6}},
    "quantize": {"awq_grid": 4, "heldout_sequences": 4, "calibration": {"n_sequences": 8, "seq_len": 64}},
    "evaluate": {"n_repeats": 1},
    "train": {"methods": ["lora", "qlora", "nvfp4_lora", "qerl"], "steps": 2, "prompts_per_step": 2,
              "checkpoint_every": 1,
              "tasks": {"tiny_grpo": {"source": "tiny", "algorithm": "grpo", "group_size": 2, "max_new_tokens": 12},
                        "tiny_dapo": {"source": "tiny", "algorithm": "dapo", "group_size": 2, "max_new_tokens": 12,
                                      "dynamic_sampling": True, "methods": ["lora", "nvfp4_lora", "qerl"]}},
              "ablations": {"aqn_schedules": ["cosine"], "ranks": [8], "lrs": [1.0e-3], "lr_methods": ["qerl"]}},
}


def _merge(base, top):
    for key, value in top.items():
        base[key] = _merge(base.get(key, {}), value) if isinstance(value, dict) and key != "tasks" else value
    return base


@pytest.mark.slow
def test_trimmed_tiny_dag_builds_every_artifact(repo_root, tmp_path):
    cfg = _merge(yaml.safe_load((repo_root / "config" / "config.yaml").read_text()), TRIMMED)
    cfg["results_dir"] = str(tmp_path / "results")
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
