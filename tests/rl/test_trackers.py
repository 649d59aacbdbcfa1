"""Trackers (qerl/rl/trackers.py) read back with their own readers: every MetricsRow field per step, a resume
replacing the record, the config attached, and a clear error naming the extra when a package is missing. The
trained run's TensorBoard files against its metrics.jsonl: tests/rl/test_trainer.py."""
from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
from dataclasses import asdict, fields
from pathlib import Path

import pytest

from qerl.contract.records import MetricsRow
from qerl.rl.trackers import TAGS, open_trackers

REPO = Path(__file__).resolve().parents[2]


def _rows(n: int) -> list[MetricsRow]:
    rows = []
    for k in range(n):
        values = {f.name: (k if f.type == "int" else 0.1 * k + i / 7) for i, f in enumerate(fields(MetricsRow))}
        values["kl"] = math.nan if k == 1 else values["kl"]
        rows.append(MetricsRow(**values))
    return rows


def read_tensorboard(folder: Path) -> dict[str, dict[int, float]]:
    """tag -> step -> value, through TensorBoard's own reader."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(folder), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    return {tag: {e.step: e.value for e in acc.Scalars(tag)} for tag in acc.Tags()["scalars"]}


def assert_same(logged: dict[str, dict[int, float]], rows: list[MetricsRow]) -> None:
    assert set(logged) == set(TAGS.values())
    for field, tag in TAGS.items():
        want = {r.step: float(getattr(r, field)) for r in rows}
        got = logged[tag]
        assert sorted(got) == sorted(want), tag
        for step, value in want.items():  # TensorBoard keeps float32
            assert (math.isnan(value) and math.isnan(got[step])) or got[step] == pytest.approx(value, rel=1e-6), tag


def _open(names, tmp_path, history, **kw):
    return open_trackers(names, run_dir=tmp_path, root=str(tmp_path / "R"), scale="tiny",
                         run_name="tiny_grpo/tiny/qerl/default/seed0", config={"scale": "tiny"},
                         info={"settings": {"seed": 0}}, history=history, **kw)


def test_tensorboard_holds_every_field_and_a_resume_replaces_it(tmp_path):
    pytest.importorskip("tensorboard")
    rows = _rows(4)
    t = _open(["tensorboard"], tmp_path, rows[:2])
    for r in rows[2:]:
        t.log(r)
    t.close()
    assert_same(read_tensorboard(tmp_path / "tensorboard"), rows)
    t = _open(["tensorboard"], tmp_path, rows[:1])  # resumed after step 0: steps 1-3 are logged again
    t.close()
    assert_same(read_tensorboard(tmp_path / "tensorboard"), rows[:1])

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(tmp_path / "tensorboard"))
    acc.Reload()
    assert {"run/name/text_summary", "run/config/text_summary", "run/info/text_summary"} <= set(acc.Tags()["tensors"])


@pytest.mark.parametrize("name", ["tensorboard", "trackio"])
def test_a_missing_package_names_the_extra(tmp_path, monkeypatch, name):
    monkeypatch.setitem(sys.modules, name, None)  # import fails as if the package were absent
    monkeypatch.delitem(sys.modules, "torch.utils.tensorboard", raising=False)
    with pytest.raises(RuntimeError, match=rf"train.report_to lists '{name}'.*pip install -e '\.\[trackers\]'"):
        _open([name], tmp_path, [])


_TRACKIO = """
import json, sys
from qerl.rl.trackers import open_trackers
from tests.rl.test_trackers import _rows
rows = _rows(3)
t = open_trackers(["trackio"], run_dir=sys.argv[1], root=sys.argv[1], scale="tiny", run_name="a/b/qerl/default/seed0",
                  config={"scale": "tiny"}, info={}, history=rows[:int(sys.argv[2])])
for r in rows[int(sys.argv[2]):]:
    t.log(r)
t.close()
from trackio.sqlite_storage import SQLiteStorage
print(json.dumps(SQLiteStorage.get_logs("qerl-tiny", "a/b/qerl/default/seed0")))
"""


@pytest.mark.skipif(importlib.util.find_spec("trackio") is None, reason="trackio not installed (the trackers extra)")
def test_trackio_holds_every_field_offline(tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO)] + sys.path)}
    for history in (1, 2):  # the second run is a resume: the run's logs are replaced, not appended to
        out = subprocess.run([sys.executable, "-c", _TRACKIO, str(tmp_path), str(history)], env=env, text=True,
                             capture_output=True, check=True).stdout
    logs = json.loads(out.splitlines()[-1])
    assert [e["step"] for e in logs] == [0, 1, 2]
    assert_same({tag: {e["step"]: (math.nan if e.get(tag) is None else e[tag]) for e in logs} for tag in TAGS.values()},
                _rows(3))
    assert (tmp_path / "trackio" / "qerl-tiny.db").is_file()
