"""Each job's wall time and peak memory of one DAG run, as a Markdown table.

Why: the paper scale with random weights (config/paper_random.yaml) runs every rule once at real size to measure
what each stage costs; the numbers are spread over Snakemake's benchmark files (R/benchmarks/**.tsv: wall seconds
and the host's max RSS in MB) and the jobs' own peak-memory records (qerl.memory.peak_memory_bytes: the GPU's
allocator peak where CUDA ran, else the host RSS): models/<model>/base/prepare_info.json, the last line of
logs/calibrate/<model>/<fmt>.log, quantized/<model>/<fmt>/layer_errors.json, evals/<model>/<method>/<benchmark>/
seed<k>.json, and the largest step of runs/<task>/<model>/<method>/<variant>/seed<k>/metrics.jsonl. A training job's
row also splits its seconds as its runs' eval.json record them (train.seconds: setup, steps, save, evaluate; summed
over the runs of a grouped job). This reads them all and prints one row per job (the table and figure jobs summed
into one row).

    python -m qerl.profiling.stage_costs results/random/paper            # Markdown on stdout
"""
from __future__ import annotations

import argparse
import csv
import json
from pathlib import Path

__all__ = ["read_benchmark", "stage_costs", "render", "main"]

_RENDER = {"render"}  # benchmark folders of the table / figure / claims jobs: one summed row


def _peak(root: Path, rel: Path) -> int | None:
    """The job's own peak-memory record (bytes), or None where the stage writes none."""
    parts, stem = rel.parts, rel.with_suffix("").as_posix()
    candidates = {
        "prepare_model": lambda: [json.loads(p.read_text()).get("peak_memory_bytes")
                                  for p in sorted(root.glob("models/*/*/prepare_info.json"))],
        "calibrate": lambda: [json.loads((root / "logs" / f"{stem}.log").read_text().strip().splitlines()[-1])
                              .get("peak_memory_bytes")],
        "quantize": lambda: [json.loads((root / "quantized" / Path(stem).relative_to("quantize") /
                                         "layer_errors.json").read_text()).get("peak_memory_bytes")],
        "evaluate": lambda: [json.loads(path.read_text()).get("peak_memory_bytes") for path in _eval_files(root, rel)],
        "train": lambda: [json.loads(line).get("peak_memory_bytes") for path in _run_files(root, rel, "metrics.jsonl")
                          for line in path.read_text().splitlines()],
    }
    key = parts[0] if len(parts) > 1 else rel.stem
    if key not in candidates:
        return None
    try:
        values = [v for v in candidates[key]() if v is not None]
    except (OSError, ValueError, IndexError):
        return None
    return max(values) if values else None


def _eval_files(root: Path, rel: Path) -> list[Path]:
    """The evaluation files of job `rel`: evaluate/<model>/<method>/<benchmark>/seed<k>, or a grouped job's
    .../seed0-1-2 (one file per seed)."""
    sub = rel.with_suffix("").relative_to("evaluate")
    seeds = sub.name.removeprefix("seed").split("-")
    return [root / "evals" / sub.parent / f"seed{k}.json" for k in seeds]


def _run_files(root: Path, rel: Path, name: str) -> list[Path]:
    """The file `name` of each run of training job `rel` (train/<task>/<model>/<method>/<variant>/seed<k>, or a
    grouped job's train/<task>/<model>/<method>/all-runs: every variant and seed of the method)."""
    parts = rel.with_suffix("").parts[1:]
    if parts[-1] == "all-runs":
        return sorted((root / "runs" / Path(*parts[:-1])).glob(f"*/seed*/{name}"))
    return [root / "runs" / Path(*parts) / name]


def _inside(root: Path, rel: Path) -> dict | None:
    """A training job's seconds by phase ({"setup", "steps", "save", "evaluate"}), summed over its runs' eval.json
    (train.seconds; a grouped job, train/<task>/<model>/<method>/all-runs, has several), or None where none records
    them (older runs, other rules)."""
    if rel.parts[0] != "train":
        return None
    total: dict[str, float] = {}
    for path in _run_files(root, rel, "eval.json"):
        try:
            seconds = json.loads(path.read_text()).get("train", {}).get("seconds")
        except (OSError, ValueError):
            continue
        for k, v in (seconds or {}).items():
            total[k] = total.get(k, 0.0) + float(v)
    return total or None


def read_benchmark(tsv: str | Path) -> tuple[float, float] | None:
    """(wall seconds, host max RSS in GiB) of one Snakemake benchmark file, or None for an empty one. The one reader
    of these files (tests/tools/job_seconds.py uses it too)."""
    with open(tsv, newline="") as f:
        rec = next(csv.DictReader(f, delimiter="\t"), None)
    if rec is None:
        return None
    return float(rec["s"]), float(rec["max_rss"]) / 1024 if rec["max_rss"] not in ("", "NA") else 0.0


def stage_costs(root: str | Path) -> list[dict]:
    """One dict per job: {"job", "seconds", "max_rss_gb" (host, GiB), "peak_gb" (1e9 bytes) (the job's own record, or
    None), "inside" (a training job's seconds by phase, `_inside`, or None)}.

    Args:
        root: a results/<scale>/ folder of a finished (or partly finished) DAG run.

    Raises:
        ValueError: the folder has no benchmarks/ (not a DAG's results folder).
    """
    root = Path(root)
    if not (root / "benchmarks").is_dir():
        raise ValueError(f"{root}: no benchmarks/ folder (give a results/<scale>/ folder of a DAG run)")
    rows, rendered = [], {"job": "tables, figures, claims (summed)", "seconds": 0.0, "max_rss_gb": 0.0,
                          "peak_gb": None, "inside": None, "jobs": 0}
    for tsv in sorted((root / "benchmarks").rglob("*.tsv")):
        rel = tsv.relative_to(root / "benchmarks")
        read = read_benchmark(tsv)
        if read is None:
            continue
        seconds, rss = read
        if rel.parts[0] in _RENDER:
            rendered["seconds"] += seconds
            rendered["max_rss_gb"] = max(rendered["max_rss_gb"], rss)
            rendered["jobs"] += 1
            continue
        peak = _peak(root, rel)
        rows.append({"job": rel.with_suffix("").as_posix(), "seconds": seconds, "max_rss_gb": rss,
                     "peak_gb": None if peak is None else peak / 1e9, "inside": _inside(root, rel)})
    if rendered["jobs"]:
        rows.append({k: v for k, v in rendered.items() if k != "jobs"} | {"job": f"{rendered['job']}, "
                                                                         f"{rendered['jobs']} jobs"})
    return rows


def render(rows: list[dict]) -> str:
    """The rows as a Markdown table with a total line."""
    lines = ["| job | seconds | of which (training: setup / steps / save / evaluation) | host max RSS (GiB) | "
             "peak memory (GB) |", "|---|---:|---|---:|---:|"]
    for r in rows:
        peak = "n/a" if r["peak_gb"] is None else f"{r['peak_gb']:.2f}"
        inside = r.get("inside")
        split = "" if not inside else " / ".join(f"{inside[k]:.1f}" if k in inside else "-"
                                                 for k in ("setup", "steps", "save", "evaluate"))
        lines.append(f"| {r['job']} | {r['seconds']:.1f} | {split} | {r['max_rss_gb']:.2f} | {peak} |")
    lines.append(f"| **total** | {sum(r['seconds'] for r in rows):.1f} | | | |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("root", help="a results/<scale>/ folder of a DAG run")
    args = parser.parse_args(argv)
    print(render(stage_costs(args.root)), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
