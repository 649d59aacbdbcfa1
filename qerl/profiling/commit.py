"""Commit a profiling run to results/measured/<gpu>/ (what the efficiency tables read), keeping everything there.

Why a separate step: the DAG's `profile` rule owns results/<scale>/measured/<gpu>/ (Snakemake deletes and rewrites
its outputs when it reruns the rule), while results/measured/<gpu>/ holds committed measurements with their
provenance, which nothing may delete. This script merges a finished run into the committed folder:

  * the run's own CSVs are stored unchanged as <name>.<tag>.csv (refused if that file exists); a CSV with no rows
    (a run that measured none of that kind) is left out, and the committed one is not touched;
  * each committed <name>.csv, if present, is first copied to <name>.before-<tag>.csv (refused if that exists), then
    rewritten as its old rows with the run's rows replacing those with the same key (model, method, rank, batch,
    timing for rollout.csv; see KEYS) and new keys appended;
  * the run's env.txt / log.txt, if any, are copied as profile.<tag>.env.txt / profile.<tag>.log.
Nothing is deleted and every earlier version stays readable; each file is written atomically.

Run: python -m qerl.profiling.commit --src results/paper/measured/h200 --dest results/measured/h200 --tag run9
     (then add a row for the run to the folder's profile.provenance.md and commit the files with git)
"""
from __future__ import annotations

import argparse
import csv
import shutil
from pathlib import Path

from qerl.contract.measured import MEASURED_CSVS
from qerl.io import atomic_file

__all__ = ["KEYS", "commit_run", "main"]

KEYS = {name: spec.key for name, spec in MEASURED_CSVS.items()}  # qerl/contract/measured.py


def _read(path: Path) -> tuple[list[str], list[dict]]:
    with open(path, newline="") as f:
        rd = csv.DictReader(f)
        return list(rd.fieldnames or []), list(rd)


def _write(path: Path, cols: list[str], rows: list[dict]) -> None:
    with atomic_file(path) as tmp, open(tmp, "w", newline="") as f:
        wr = csv.DictWriter(f, fieldnames=cols, extrasaction="ignore")
        wr.writeheader()
        wr.writerows(rows)


def _copy_new(src: Path, dst: Path) -> None:
    if dst.exists():
        raise ValueError(f"qerl.profiling.commit: {dst} exists; choose another --tag (nothing was changed for it)")
    with atomic_file(dst) as tmp:
        shutil.copyfile(src, tmp)


def commit_run(src: Path, dest: Path, tag: str) -> list[str]:
    """Merge the profiling CSVs of `src` into `dest` (see the module docstring).

    Args:
        src: a finished run's folder (rollout.csv, e2e.csv, memory.csv, rollout_hf.csv; any subset).
        dest: the committed folder, results/measured/<gpu>.
        tag: the run's name, letters / digits / '-' / '_' (e.g. run9).

    Returns:
        The paths written, in order.

    Raises:
        ValueError: a bad tag, no CSV in src, a tagged file that already exists, or columns that differ from the
            committed file's (the message names the file).
    """
    if not tag or not all(c.isalnum() or c in "-_" for c in tag):
        raise ValueError(f"qerl.profiling.commit: --tag must be letters, digits, '-' or '_', got {tag!r}")
    names = [n for n in KEYS if (src / n).exists() and _read(src / n)[1]]  # a header-only CSV measured nothing
    if not names:
        raise ValueError(f"qerl.profiling.commit: no profiling CSV with rows in {src} (expected one of {list(KEYS)})")
    dest.mkdir(parents=True, exist_ok=True)
    for name in names:  # check everything before writing anything
        stem = name[:-4]
        for target in (dest / f"{stem}.{tag}.csv", dest / f"{stem}.before-{tag}.csv"):
            if target.exists():
                raise ValueError(f"qerl.profiling.commit: {target} exists; choose another --tag")
        if (dest / name).exists() and _read(dest / name)[0] != _read(src / name)[0]:
            raise ValueError(f"qerl.profiling.commit: columns of {src / name} differ from {dest / name}")
    written = []
    for name in names:
        stem, key = name[:-4], KEYS[name]
        cols, new_rows = _read(src / name)
        _copy_new(src / name, dest / f"{stem}.{tag}.csv")
        written.append(str(dest / f"{stem}.{tag}.csv"))
        merged = []
        if (dest / name).exists():
            _copy_new(dest / name, dest / f"{stem}.before-{tag}.csv")
            written.append(str(dest / f"{stem}.before-{tag}.csv"))
            _, old_rows = _read(dest / name)
            fresh = {tuple(r[k] for k in key): r for r in new_rows}
            for r in old_rows:
                merged.append(fresh.pop(tuple(r[k] for k in key), r))
            new_rows = [r for r in new_rows if tuple(r[k] for k in key) in fresh]
        _write(dest / name, cols, merged + new_rows)
        written.append(str(dest / name))
    for extra, target in (("env.txt", f"profile.{tag}.env.txt"), ("log.txt", f"profile.{tag}.log")):
        if (src / extra).exists():
            _copy_new(src / extra, dest / target)
            written.append(str(dest / target))
    return written


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m qerl.profiling.commit", description=__doc__.split("\n")[0])
    ap.add_argument("--src", required=True, help="a finished profiling run (e.g. results/paper/measured/h200)")
    ap.add_argument("--dest", required=True, help="the committed folder (results/measured/<gpu>)")
    ap.add_argument("--tag", required=True, help="name of the run, e.g. run9")
    args = ap.parse_args(argv)
    try:
        for path in commit_run(Path(args.src), Path(args.dest), args.tag):
            print(path)
    except ValueError as exc:
        print(exc)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
