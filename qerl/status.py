"""Where every training run of a config stands, from the files the runs write: `qerl status`.

Why: the DAG runs 40-odd training runs (days each at the paper scale); one table should say which are done, which
run, which failed and why, without opening forty logs. Everything is read from files, so a results folder copied
from another machine (with its effective config, R/config.yaml) reads the same.

Per run (qerl.contract.grid.train_runs, the grid the Snakefile trains; paths from qerl.contract.paths):
  steps     lines of metrics.jsonl / the run's steps (run.json's settings, else config train.steps)
  reward    the last step's mean reward;  s/step: mean of time_rollout + time_logprobs + time_update
  pass@1    held-out pass@1 (%) of eval.json, per benchmark
  state     done         eval.json written (and the job not marked incomplete)
            running      Snakemake marked the job incomplete (.snakemake/incomplete) and holds a lock on the folder
            incomplete   marked incomplete, but no Snakemake holds the folder: killed (`snakemake --unlock` if a
                         lock is left, then `--rerun-incomplete`; training resumes from checkpoint.pt)
            failed       the log ends in an error (its last error line is shown)
            stopped      metrics or a checkpoint, no eval.json, no error, no Snakemake marker
            not started  none of the above
Snakemake's lock: the workflow folder's .snakemake/locks/*.lock list the files of a running (or killed -9) Snakemake;
a lock naming a file under the results folder means "locked" (`StatusReport.locks`).

Run the tests: `pytest tests/test_status.py -q`.
"""
from __future__ import annotations

import base64
import json
import os
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path

from qerl.contract.grid import train_runs
from qerl.contract.paths import (CHECKPOINT_FILE, EVAL_FILE, METRICS_FILE, RUN_INFO_FILE, run_dir, train_group_log,
                                 train_log)
from qerl.contract.records import BenchmarkRecord

__all__ = ["RunStatus", "StatusReport", "collect_status", "format_table", "format_tsv", "format_json"]

_ERROR = re.compile(r"\b\w*(Error|Exception)\b|\berror\b|Killed|Traceback")
_COLUMNS = ("task", "method", "variant", "seed", "steps", "reward", "pass@1", "s/step", "state")


@dataclass
class RunStatus:
    """One training run's state (module docstring).

    Attributes:
        task, method, variant, seed: the run; folder: its folder.
        steps_done, steps_total: metrics.jsonl lines and the run's steps.
        reward: the last step's mean reward (None before the first step).
        pass_at_1: benchmark -> held-out pass@1 in % (empty before eval.json).
        seconds_per_step: mean phase time of the steps done (None before the first step).
        state: done, running, incomplete, failed, stopped or not started; detail: the failed log's last error line.
    """

    task: str
    method: str
    variant: str
    seed: int
    folder: str
    steps_done: int
    steps_total: int
    reward: float | None
    pass_at_1: dict[str, float]
    seconds_per_step: float | None
    state: str
    detail: str = ""


@dataclass
class StatusReport:
    """Every run of a config, and the Snakemake locks held on its results folder."""

    results: str
    runs: list[RunStatus]
    locks: list[str] = field(default_factory=list)


def _metrics(path: Path) -> list[dict]:
    """The parsed lines of a metrics.jsonl that may be being written (a torn last line is skipped)."""
    if not path.is_file():
        return []
    rows = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            break
    return rows


def _last_error(log: Path) -> str | None:
    """The last line of a log that reads as an error (a Python exception line, `error`, `Killed`), else None."""
    if not log.is_file():
        return None
    lines = [l.strip() for l in log.read_text(encoding="utf-8", errors="replace").splitlines() if l.strip()]
    hits = [l for l in lines if _ERROR.search(l)]
    return hits[-1][:200] if hits else None


def _relative(path: Path, workdir: Path) -> str:
    """`path` as Snakemake names it: relative to the workflow folder when under it, else absolute."""
    try:
        return os.path.relpath(path.resolve(), workdir.resolve()) if path.resolve().is_relative_to(
            workdir.resolve()) else str(path.resolve())
    except ValueError:
        return str(path.resolve())


def _incomplete(workdir: Path) -> set[str]:
    """The output files Snakemake marked incomplete: .snakemake/incomplete/<urlsafe base64 of the path>, a long
    name split into folders whose names start with "@"."""
    folder = workdir / ".snakemake" / "incomplete"
    marked = set()
    for f in folder.rglob("*") if folder.is_dir() else []:
        if f.is_file() and f.name != "migration_underway":
            b64 = "".join(part.lstrip("@") for part in f.relative_to(folder).parts)
            try:
                marked.add(base64.urlsafe_b64decode(b64.encode()).decode())
            except (ValueError, UnicodeDecodeError):
                continue
    return marked


def _locks(workdir: Path, results: Path) -> list[str]:
    """The lock files of .snakemake/locks that name a file under `results`."""
    folder = workdir / ".snakemake" / "locks"
    prefix = _relative(results, workdir).rstrip("/") + "/"
    absolute = str(results.resolve()).rstrip("/") + "/"
    found = []
    for lock in sorted(folder.glob("*.lock")) if folder.is_dir() else []:
        names = lock.read_text(encoding="utf-8", errors="replace").splitlines()
        if any(n.startswith(prefix) or n.startswith(absolute) or n == prefix.rstrip("/") for n in names):
            found.append(str(lock))
    return found


def _run_status(cfg: dict, root: str, run: tuple, workdir: Path, marked: set[str], locked: bool) -> RunStatus:
    task, method, variant, seed = run
    model = cfg["model"]["name"]
    folder = Path(run_dir(root, task, model, method, variant, seed))
    rows = _metrics(folder / METRICS_FILE)
    total = cfg["train"]["steps"]
    info = folder / RUN_INFO_FILE
    if info.is_file():
        try:
            total = json.loads(info.read_text())["settings"]["steps"]
        except (ValueError, KeyError, TypeError):
            pass
    scores = {}
    eval_path = folder / EVAL_FILE
    if eval_path.is_file():
        try:
            benchmarks = json.loads(eval_path.read_text())["benchmarks"]
            scores = {name: BenchmarkRecord.parse(rec, f"{eval_path}: benchmarks.{name}").pass_at_1
                      for name, rec in benchmarks.items()}
        except (ValueError, KeyError, TypeError):
            scores = {}
    times = [r.get("time_rollout", 0) + r.get("time_logprobs", 0) + r.get("time_update", 0) for r in rows]
    is_marked = any(_relative(folder / name, workdir) in marked for name in (METRICS_FILE, EVAL_FILE))
    # the run's own job log, or the log of the job that trains its (task, method) group (resources.train.group_runs)
    own = Path(train_log(root, task, model, method, variant, seed))
    error, detail = _last_error(own if own.is_file() else Path(train_group_log(root, task, model, method))), ""
    if is_marked and locked:
        state = "running"
    elif is_marked:
        state = "incomplete"
    elif eval_path.is_file():
        state = "done"
    elif error:
        state, detail = "failed", error
    elif rows or (folder / CHECKPOINT_FILE).is_file():
        state = "stopped"
    else:
        state = "not started"
    return RunStatus(task, method, variant, int(seed), str(folder), len(rows), int(total),
                     rows[-1].get("reward") if rows else None, scores,
                     sum(times) / len(times) if times else None, state, detail)


def collect_status(cfg: dict, results: str | Path | None = None, workdir: str | Path = ".") -> StatusReport:
    """The state of every training run of `cfg` (qerl.contract.grid.train_runs), read from its files.

    Args:
        cfg: a validated config (its grid of runs, model name and steps).
        results: the results folder R holding runs/ and logs/ (default: the config's results_dir/scale).
        workdir: the workflow folder whose .snakemake/ holds Snakemake's locks and incomplete markers.
    """
    root = str(results) if results is not None else f"{cfg['results_dir']}/{cfg['scale']}"
    work = Path(workdir)
    locks = _locks(work, Path(root))
    marked = _incomplete(work)
    runs = [_run_status(cfg, root, run, work, marked, bool(locks)) for run in train_runs(cfg)]
    return StatusReport(root, runs, locks)


def _cells(r: RunStatus) -> list[str]:
    scores = " ".join(f"{v:.1f}" if len(r.pass_at_1) == 1 else f"{k}:{v:.1f}" for k, v in r.pass_at_1.items())
    state = f"{r.state}: {r.detail}" if r.detail else r.state
    return [r.task, r.method, r.variant, str(r.seed), f"{r.steps_done}/{r.steps_total}",
            "" if r.reward is None else f"{r.reward:.3f}", scores,
            "" if r.seconds_per_step is None else f"{r.seconds_per_step:.2f}", state]


def format_table(report: StatusReport) -> str:
    """An aligned text table, a summary line of the states, and a line naming Snakemake's locks if any."""
    rows = [list(_COLUMNS)] + [_cells(r) for r in report.runs]
    widths = [max(len(row[i]) for row in rows) for i in range(len(_COLUMNS) - 1)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)) + "  " + row[-1] for row in rows]
    counts: dict[str, int] = {}
    for r in report.runs:
        counts[r.state] = counts.get(r.state, 0) + 1
    lines.append(f"{len(report.runs)} runs in {report.results}: " + ", ".join(f"{n} {s}" for s, n in counts.items()))
    if report.locks:
        lines.append(f"locked by Snakemake ({', '.join(report.locks)}): a workflow is running here, or one was killed;"
                     f" if none runs: snakemake --unlock, then snakemake --cores all --rerun-incomplete")
    return "\n".join(lines) + "\n"


def format_tsv(report: StatusReport) -> str:
    """Tab-separated, a header line, one line per run (pass@1 as benchmark:value, space-separated)."""
    head = list(_COLUMNS[:-1]) + ["state", "detail"]
    lines = ["\t".join(head)]
    for r in report.runs:
        cells = _cells(r)[:-1]
        cells[6] = " ".join(f"{k}:{v:.1f}" for k, v in r.pass_at_1.items())
        lines.append("\t".join(cells + [r.state, r.detail.replace("\t", " ")]))
    return "\n".join(lines) + "\n"


def format_json(report: StatusReport) -> str:
    """The whole report as JSON: {"results", "locks", "runs": [RunStatus fields]}."""
    return json.dumps(asdict(report), indent=1) + "\n"
