"""Committing a profiling run (qerl.profiling.commit): the run's rows replace same-key rows and new ones are added,
every earlier file stays readable (tagged copies), a tag is never reused, and --publish copies finished CSVs only."""
from __future__ import annotations

import csv

import pytest

from qerl.profiling.commit import commit_run, main
from qerl.profiling.run import publish


def _write(path, rows, cols=("model", "method", "rank", "batch", "tokens_per_s", "timing")):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        wr = csv.DictWriter(f, fieldnames=cols)
        wr.writeheader()
        wr.writerows(rows)


def _rows(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def _r(batch, tps, method="qerl"):
    return dict(model="7B", method=method, rank=32, batch=batch, tokens_per_s=tps, timing="buckets")


def test_commit_merges_and_keeps_everything(tmp_path):
    dest, src = tmp_path / "measured" / "h200", tmp_path / "run"
    _write(dest / "rollout.csv", [_r(1, 100), _r(8, 800), _r(1, 90, "lora")])
    _write(src / "rollout.csv", [_r(1, 300), _r(256, 9000)])
    _write(dest / "e2e.csv", [_r(2, 5)])
    _write(src / "e2e.csv", [])  # a run that timed no GRPO step: its header-only CSV changes nothing
    (src / "log.txt").write_text("log")
    written = commit_run(src, dest, "run9")
    assert {p.split("/")[-1] for p in written} == {"rollout.run9.csv", "rollout.before-run9.csv", "rollout.csv",
                                                   "profile.run9.log"}
    merged = [(r["method"], r["batch"], r["tokens_per_s"]) for r in _rows(dest / "rollout.csv")]
    assert merged == [("qerl", "1", "300"), ("qerl", "8", "800"), ("lora", "1", "90"), ("qerl", "256", "9000")]
    assert [r["tokens_per_s"] for r in _rows(dest / "rollout.before-run9.csv")] == ["100", "800", "90"]
    assert [r["tokens_per_s"] for r in _rows(dest / "rollout.run9.csv")] == ["300", "9000"]
    assert [r["tokens_per_s"] for r in _rows(dest / "e2e.csv")] == ["5"] and not (dest / "e2e.run9.csv").exists()
    with pytest.raises(ValueError, match="exists"):  # a tag is used once; nothing changes on refusal
        commit_run(src, dest, "run9")
    assert len(_rows(dest / "rollout.csv")) == 4
    assert main(["--src", str(src), "--dest", str(dest), "--tag", "bad tag"]) == 2


def test_commit_refuses_other_columns(tmp_path):
    dest, src = tmp_path / "d", tmp_path / "s"
    _write(dest / "rollout.csv", [_r(1, 100)])
    _write(src / "rollout.csv", [dict(model="7B", batch=1)], cols=("model", "batch"))
    with pytest.raises(ValueError, match="columns"):
        commit_run(src, dest, "x")
    assert not (dest / "rollout.x.csv").exists()


def test_publish_copies_finished_csvs(tmp_path):
    work, out = tmp_path / "partial", tmp_path / "out"
    _write(work / "rollout.csv", [_r(1, 100)])
    _write(work / "e2e.csv", [], cols=("model",))
    publish(work, out)
    assert _rows(out / "rollout.csv") == _rows(work / "rollout.csv") and (out / "e2e.csv").exists()
    assert not (out / "memory.csv").exists() and not list(out.glob(".*tmp"))
