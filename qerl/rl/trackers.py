"""Experiment trackers (config train.report_to): every metrics.jsonl field per step in TensorBoard and/or Trackio,
offline, beside the files the run writes anyway.

Why: at the paper scale a run is 600 steps over days; practitioners watch live curves in a tracker (TRL's
`report_to`, TensorBoard everywhere, Trackio as TRL's documentation now recommends) rather than tail a JSONL file.
metrics.jsonl stays the record the report reads; a tracker shows the same rows, nothing else, so the two never
disagree.

Names: each MetricsRow field except `step` is the scalar `train/<field>` at global step = the training step
(`TAGS`); the run's name is its results path, <task>/<model>/<method>/<variant>/seed<k>
(qerl.contract.paths.run_name); the config and the run's settings and provenance (run.json's content) are attached
(TensorBoard: text summaries `run/name`, `run/config`, `run/info`; Trackio: the run's config).

Where, offline (nothing is sent anywhere):
  tensorboard  <run>/tensorboard/ event files:  `tensorboard --logdir results/tiny/runs` shows every run by name.
  trackio      R/trackio/<project>.db, project qerl-<scale>: `TRACKIO_DIR=results/tiny/trackio trackio show
               --project qerl-tiny`.
Resume: a tracker's record of the run is replaced, not appended to: the TensorBoard folder is emptied and the Trackio
run deleted, then the metrics history restored from the checkpoint is logged again, so a resumed run's tracker holds
exactly metrics.jsonl's rows.

The packages are optional: `pip install -e '.[trackers]'`; asking for a tracker whose package is missing fails
before training starts, naming the extra.

Run the tests: `pytest tests/rl/test_trackers.py -q`.
"""
from __future__ import annotations

import json
import os
import shutil
from dataclasses import asdict, fields
from pathlib import Path

from qerl.contract.paths import TENSORBOARD_DIR, trackio_dir
from qerl.contract.records import MetricsRow

__all__ = ["TRACKERS", "TAGS", "Trackers", "open_trackers"]

TRACKERS = ("tensorboard", "trackio")
#: MetricsRow field -> the tracker's scalar name.
TAGS = {f.name: f"train/{f.name}" for f in fields(MetricsRow) if f.name != "step"}
_PACKAGE = {"tensorboard": "tensorboard", "trackio": "trackio"}


def _missing(name: str) -> RuntimeError:
    return RuntimeError(f"config train.report_to lists {name!r}, but the {_PACKAGE[name]!r} package is not installed;"
                        f" install the trackers extra: pip install -e '.[trackers]'")


class _TensorBoard:
    def __init__(self, run_dir: Path, run_name: str, attached: dict):
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:  # torch raises this when the tensorboard package is absent
            raise _missing("tensorboard") from None
        folder = run_dir / TENSORBOARD_DIR
        shutil.rmtree(folder, ignore_errors=True)
        self.writer = SummaryWriter(log_dir=str(folder))
        self.writer.add_text("run/name", run_name, 0)
        for key, value in attached.items():
            self.writer.add_text(f"run/{key}", "```\n" + json.dumps(value, indent=2, default=list) + "\n```", 0)

    def log(self, row: MetricsRow) -> None:
        values = asdict(row)
        for field, tag in TAGS.items():
            self.writer.add_scalar(tag, float(values[field]), row.step)

    def close(self) -> None:
        self.writer.close()


class _Trackio:
    def __init__(self, root: str, scale: str, run_name: str, attached: dict):
        wanted = Path(trackio_dir(root)).resolve()
        os.environ["TRACKIO_DIR"] = str(wanted)  # read by trackio at import
        try:
            import trackio
            from trackio import utils
            from trackio.sqlite_storage import SQLiteStorage
        except ImportError:
            raise _missing("trackio") from None
        if Path(utils.TRACKIO_DIR).resolve() != wanted:
            raise RuntimeError(f"trackio was imported before this run set TRACKIO_DIR: it writes to "
                               f"{utils.TRACKIO_DIR}, not {wanted}; log one run per process")
        self.project = f"qerl-{scale}"
        SQLiteStorage.delete_run(self.project, run_name)  # a resumed run logs its history again
        self.trackio = trackio
        self.run = trackio.init(project=self.project, name=run_name, config=json.loads(json.dumps(attached,
                                default=list)), embed=False, auto_log_cpu=False, auto_log_gpu=False)

    def log(self, row: MetricsRow) -> None:
        values = asdict(row)
        self.trackio.log({tag: float(values[field]) for field, tag in TAGS.items()}, step=row.step)

    def close(self) -> None:
        self.trackio.finish()


class Trackers:
    """The trackers a run logs to (none: every call is a no-op)."""

    def __init__(self, backends: list):
        self.backends = backends

    def log(self, row: MetricsRow) -> None:
        """Log one step's metrics to every tracker."""
        for b in self.backends:
            b.log(row)

    def close(self) -> None:
        """Flush and close every tracker."""
        for b in self.backends:
            b.close()


def open_trackers(names: list[str], *, run_dir: str | Path, root: str, scale: str, run_name: str, config: dict,
                  info: dict, history: list[MetricsRow]) -> Trackers:
    """Open the trackers `names` for one run and log its metrics history (the steps before a resume) to them.

    Args:
        names: config train.report_to (TRACKERS).
        run_dir: the run folder; root: R; scale: the config's scale.
        run_name: qerl.contract.paths.run_name of the run.
        config: the validated config; info: run.json's content (settings, provenance): both attached.
        history: the rows of the steps already done.

    Raises:
        RuntimeError: a tracker whose package is not installed, naming the extra.
        ValueError: an unknown tracker name.
    """
    backends = []
    attached = {"config": config, "info": info}
    for name in names:
        if name == "tensorboard":
            backends.append(_TensorBoard(Path(run_dir), run_name, attached))
        elif name == "trackio":
            backends.append(_Trackio(root, scale, run_name, attached))
        else:
            raise ValueError(f"config train.report_to: unknown tracker {name!r}; known: {list(TRACKERS)}")
    trackers = Trackers(backends)
    for row in history:
        trackers.log(row)
    return trackers
