"""qerl.profiling.stage_costs: each job's seconds, host RSS and its own peak-memory record, from a results folder.
Run: `python -m pytest -q tests/profiling/test_stage_costs.py`."""
from __future__ import annotations

import json

import pytest

from qerl.profiling.stage_costs import main, render, stage_costs

HEADER = "s\th:m:s\tmax_rss\tmax_vms\tmax_uss\tmax_pss\tio_in\tio_out\tmean_load\tcpu_time\n"


def _tsv(path, seconds, rss_mb):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(HEADER + f"{seconds}\t0:00:01\t{rss_mb}\t1\t1\t1\t0\t0\t50\t1\n")


def test_rows_join_benchmarks_and_peak_records(tmp_path, capsys):
    root = tmp_path / "paper"
    _tsv(root / "benchmarks" / "prepare_model.tsv", 61.5, 2048)
    (root / "models" / "m" / "base").mkdir(parents=True)
    (root / "models" / "m" / "base" / "prepare_info.json").write_text(json.dumps({"peak_memory_bytes": 16e9}))
    _tsv(root / "benchmarks" / "calibrate" / "m" / "nvfp4.tsv", 120, 1024)
    (root / "logs" / "calibrate" / "m").mkdir(parents=True)
    (root / "logs" / "calibrate" / "m" / "nvfp4.log").write_text('loading\n{"peak_memory_bytes": 45000000000}\n')
    _tsv(root / "benchmarks" / "train" / "gsm8k" / "m" / "qerl" / "default" / "seed0.tsv", 300, 4096)
    run = root / "runs" / "gsm8k" / "m" / "qerl" / "default" / "seed0"
    run.mkdir(parents=True)
    (run / "metrics.jsonl").write_text('{"peak_memory_bytes": 3e10}\n{"peak_memory_bytes": 4e10}\n')
    (run / "eval.json").write_text(json.dumps({"train": {"seconds": {"setup": 20, "steps": 250, "save": 1,
                                                                       "evaluate": 25}}}))
    # a grouped job (the seeds of a method in one process): peak over its runs, phases summed over them
    _tsv(root / "benchmarks" / "train" / "gsm8k" / "m" / "lora" / "all-runs.tsv", 100, 2048)
    for k, steps in enumerate((30, 40)):
        seed = root / "runs" / "gsm8k" / "m" / "lora" / "default" / f"seed{k}"
        seed.mkdir(parents=True)
        (seed / "metrics.jsonl").write_text(f'{{"peak_memory_bytes": {(k + 1) * 1e9}}}\n')
        (seed / "eval.json").write_text(json.dumps({"train": {"seconds": {"setup": 5, "steps": steps,
                                                                            "evaluate": 4}}}))
    _tsv(root / "benchmarks" / "evaluate" / "m" / "bf16" / "gsm8k" / "seed0.tsv", 90, 1024)  # no record yet
    _tsv(root / "benchmarks" / "evaluate" / "m" / "nf4" / "gsm8k" / "seed0-1-2.tsv", 80, 1024)  # a grouped job
    for k in range(3):
        (root / "evals" / "m" / "nf4" / "gsm8k").mkdir(parents=True, exist_ok=True)
        seed = root / "evals" / "m" / "nf4" / "gsm8k" / f"seed{k}.json"
        seed.write_text(json.dumps({"peak_memory_bytes": k * 1e9}))
    for name in ("table1", "fig8"):
        _tsv(root / "benchmarks" / "render" / f"{name}.tsv", 2.5, 512)
    rows = {r["job"]: r for r in stage_costs(root)}
    assert rows["prepare_model"]["peak_gb"] == 16 and rows["prepare_model"]["max_rss_gb"] == 2
    assert rows["calibrate/m/nvfp4"]["peak_gb"] == 45 and rows["calibrate/m/nvfp4"]["seconds"] == 120
    assert rows["train/gsm8k/m/qerl/default/seed0"]["peak_gb"] == 40  # the largest step
    assert rows["train/gsm8k/m/qerl/default/seed0"]["inside"] == {"setup": 20, "steps": 250, "save": 1, "evaluate": 25}
    assert rows["train/gsm8k/m/lora/all-runs"]["peak_gb"] == 2
    assert rows["train/gsm8k/m/lora/all-runs"]["inside"] == {"setup": 10, "steps": 70, "evaluate": 8}
    assert rows["prepare_model"]["inside"] is None
    assert rows["evaluate/m/bf16/gsm8k/seed0"]["peak_gb"] is None
    assert rows["evaluate/m/nf4/gsm8k/seed0-1-2"]["peak_gb"] == 2  # the largest of its seeds
    assert rows["tables, figures, claims (summed), 2 jobs"]["seconds"] == 5
    table = render(list(rows.values()))
    assert "| **total** | 756.5 | | | |" in table and "| evaluate/m/bf16/gsm8k/seed0 | 90.0 |  | 1.00 | n/a |" in table
    assert "| train/gsm8k/m/qerl/default/seed0 | 300.0 | 20.0 / 250.0 / 1.0 / 25.0 | 4.00 | 40.00 |" in table
    assert "| train/gsm8k/m/lora/all-runs | 100.0 | 10.0 / 70.0 / - / 8.0 | 2.00 | 2.00 |" in table
    assert main([str(root)]) == 0 and capsys.readouterr().out == table


def test_a_folder_without_benchmarks_is_named(tmp_path):
    with pytest.raises(ValueError, match="no benchmarks/ folder"):
        stage_costs(tmp_path)
