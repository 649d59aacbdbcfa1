"""Where a DAG run's job-seconds went: per stage, the jobs, their wall seconds (Snakemake's benchmark files), and for
training how much of it was RL steps, the in-job evaluation and the rest (process start-up and imports, the policy
build, reading and writing files).

Why: `make reproduce` time is job-seconds spread over the cores, and only the RL steps are the experiment; this
names the rest, per run and per job, so a change to the job layout (resources.train.group_runs) is measured rather
than guessed. Read from the files a run leaves, so it works on any finished results folder:

    python tests/tools/job_seconds.py results/tiny            # a Markdown table
    python tests/tools/job_seconds.py /work/ref/results/tiny results/tiny   # two runs side by side

RL steps of a run: the sum of its metrics' step phases (time_rollout + time_logprobs + time_update); in-job
evaluation: its eval.json "seconds" (qerl.evaluate.run.evaluate_model). Pretraining: its training loop
(eval.json train.seconds) and the rest (imports, tokenising 40k rows, the untrained and trained evaluations, writes).
Wall seconds depend on what else the machine ran at the time: compare runs made under the same load. (Snakemake's
cpu_time column is not used: it samples the job's processes every few seconds and misses what ran after the last
sample.)
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from qerl.contract.paths import GROUP_RUNS_NAME
from qerl.profiling.stage_costs import read_benchmark

PHASES = ("time_rollout", "time_logprobs", "time_update")


def _job_seconds(tsv: Path) -> float:
    return read_benchmark(tsv)[0]


def _train_job(tsv: Path, results: Path) -> dict:
    """Seconds of one training job split into RL, evaluation and rest: one run (<variant>/seed<k>.tsv) or all the
    runs of a (task, method) (all-runs.tsv, resources.train.group_runs)."""
    rel = tsv.relative_to(results / "benchmarks" / "train")
    if tsv.stem == GROUP_RUNS_NAME:
        runs = sorted((results / "runs" / rel.parent).glob("*/seed*"))
    else:
        runs = [results / "runs" / rel.parent / rel.stem]
    rl = sum(sum(json.loads(line)[k] for k in PHASES)
             for run in runs for line in (run / "metrics.jsonl").read_text().splitlines())
    ev = sum(json.loads((run / "eval.json").read_text())["seconds"] for run in runs)
    total = _job_seconds(tsv)
    return {"runs": len(runs), "total": total, "rl": rl, "eval": ev, "rest": total - rl - ev}


def breakdown(results: str | Path) -> dict[str, dict]:
    """{stage: {"jobs", "runs", "total", "rl", "eval", "rest"}} of a finished results/<scale> folder."""
    results = Path(results)
    bench = results / "benchmarks"
    out: dict[str, dict] = {}

    def add(stage: str, **row) -> None:
        acc = out.setdefault(stage, {"jobs": 0, "runs": 0, "total": 0.0, "rl": 0.0, "eval": 0.0, "rest": 0.0})
        acc["jobs"] += 1
        for k, v in row.items():
            acc[k] += v

    for tsv in sorted(bench.rglob("*.tsv")):
        stage = tsv.relative_to(bench).parts[0].removesuffix(".tsv")
        if stage == "train":
            add("train", **_train_job(tsv, results))
        elif stage == "pretrain_tiny":
            total = _job_seconds(tsv)
            loop = json.loads((results / "models" / "tiny" / "base" / "eval.json").read_text())["train"]["seconds"]
            add(stage, total=total, rl=loop, rest=total - loop)
        else:
            add(stage, total=_job_seconds(tsv))
    return out


def _row(name: str, b: dict | None) -> str:
    if b is None:
        return f"{name} | - | - | - | - | -"
    parts = [f"{b['jobs']}" + (f" ({b['runs']} runs)" if b["runs"] else ""), f"{b['total']:.0f}"]
    parts += [f"{b[k]:.0f}" if b[k] else "" for k in ("rl", "eval", "rest")]
    return f"{name} | " + " | ".join(parts)


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__.split("\n\n")[2], file=sys.stderr)
        return 2
    tables = [breakdown(a) for a in argv]
    stages = list(dict.fromkeys(s for t in tables for s in t))
    for folder, table in zip(argv, tables):
        print(f"\n{folder} (wall seconds)")
        print("| stage | jobs | job-seconds | RL steps (pretraining: its loop) | in-job evaluation | rest |")
        print("|---|---|---|---|---|---|")
        for stage in stages:
            print("| " + _row(stage, table.get(stage)) + " |")
        total = sum(b["total"] for b in table.values())
        print(f"| all | {sum(b['jobs'] for b in table.values())} | {total:.0f} | | | |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
