"""The run grid is computed once (qerl/contract/grid.py): the DAG trains exactly `train_runs`, and every run an
artifact of the shipped configs reads is one of them, so the report never waits for a run the DAG does not make."""
from __future__ import annotations

from pathlib import Path

import pytest

from qerl.config import load_config
from qerl.contract import paths
from qerl.contract.grid import train_runs
from qerl.report.registry import ARTIFACTS, input_files

CONFIGS = sorted((Path(__file__).resolve().parents[2] / "config").glob("*.yaml"))


@pytest.mark.parametrize("path", CONFIGS, ids=[p.stem for p in CONFIGS])
def test_every_run_an_artifact_reads_is_in_the_grid(path):
    cfg = load_config(path, check_data=False)
    root, model = paths.root_of(cfg), cfg["model"]["name"]
    grid = train_runs(cfg)
    assert len(grid) == len(set(grid)), "a run listed twice"
    made = {str(Path(paths.run_dir(root, *run[:1], model, *run[1:]))) for run in grid}
    runs_read = {str(Path(f).parent) for a in ARTIFACTS.values() for f in input_files(a, cfg)
                 if Path(f).name in (paths.METRICS_FILE, paths.EVAL_FILE)}
    assert runs_read, "no artifact reads a run"
    assert runs_read <= made, sorted(runs_read - made)[:5]
