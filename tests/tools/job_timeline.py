"""When each job of a DAG run ran, and how many cores stood idle: read from Snakemake's log of that run.

Why: a DAG's wall time is its job-seconds spread over the cores plus the time cores wait; job_seconds.py measures the
first, this the second. It shows the critical path (which job ran alone, which started late, what waited on what),
so a scheduling change (the rules' `priority:`, e.g. workflow/rules/quantize.smk) is measured rather than guessed:

    python tests/tools/job_timeline.py .snakemake/log/<date>.snakemake.log     # one run (the newest: ls -t)
    python tests/tools/job_timeline.py LOG --cores 2 --every 30                # the busy cores every 30 s

Printed: one line per job (start and end in seconds from the first job's start, its seconds, threads, rule), then the
core-seconds used and left idle between the first job's start and the last job's end, and the busy cores over time.
Times come from the log's time stamps (whole seconds), so a job shorter than a second reads 0 or 1 s.
"""
from __future__ import annotations

import argparse
import re
import sys
from datetime import datetime
from pathlib import Path

_STAMP = re.compile(r"\[(\w{3} \w{3} +\d+ \d\d:\d\d:\d\d \d{4})\]")
_RULE = re.compile(r"(?:local)?rule (\w+):$")
_JOBID = re.compile(r"\s+jobid: (\d+)$")
_THREADS = re.compile(r"\s+threads: (\d+)$")
_DONE = re.compile(r"Finished jobid: (\d+)")


def read_jobs(log: str | Path) -> list[dict]:
    """[{"rule", "jobid", "threads", "start", "end"}] of a Snakemake log, in start order; times in seconds from the
    first job's start (end None for a job the log never finished).

    Raises:
        ValueError: a log with no job in it (naming the file).
    """
    stamp = first = None
    jobs: dict[str, dict] = {}
    pending = None
    for line in Path(log).read_text().splitlines():
        if m := _STAMP.match(line):
            stamp = datetime.strptime(m.group(1), "%a %b %d %H:%M:%S %Y")
        elif (m := _RULE.match(line)) and stamp is not None:
            first = first or stamp
            pending = {"rule": m.group(1), "threads": 1, "start": (stamp - first).total_seconds(), "end": None}
        elif pending is not None and (m := _JOBID.match(line)):
            pending["jobid"] = m.group(1)
            jobs[m.group(1)] = pending
        elif pending is not None and (m := _THREADS.match(line)):
            pending["threads"] = int(m.group(1))
        elif (m := _DONE.search(line)) and m.group(1) in jobs:
            jobs[m.group(1)]["end"] = (stamp - first).total_seconds()
            pending = None
    if not jobs:
        raise ValueError(f"{log}: no Snakemake job found (expected 'rule NAME:' and 'jobid: N' lines)")
    return sorted(jobs.values(), key=lambda j: (j["start"], int(j["jobid"])))


def busy(jobs: list[dict], t: float) -> int:
    """Threads of the jobs running at second `t`."""
    return sum(j["threads"] for j in jobs if j["end"] is not None and j["start"] <= t < j["end"])


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("log", help="a Snakemake log (.snakemake/log/*.snakemake.log, or the run's captured output)")
    parser.add_argument("--cores", type=int, default=2, help="the run's --cores (default 2)")
    parser.add_argument("--every", type=int, default=20, help="seconds between the busy-core samples (default 20)")
    args = parser.parse_args(argv)
    jobs = read_jobs(args.log)
    print("| start | end | seconds | threads | rule |\n|---|---|---|---|---|")
    for j in jobs:
        end = "-" if j["end"] is None else f"{j['end']:.0f}"
        secs = "-" if j["end"] is None else f"{j['end'] - j['start']:.0f}"
        print(f"| {j['start']:.0f} | {end} | {secs} | {j['threads']} | {j['rule']} |")
    wall = max(j["end"] for j in jobs if j["end"] is not None)
    used = sum(min(busy(jobs, t + 0.5), args.cores) for t in range(int(wall)))
    print(f"\nwall {wall:.0f} s; {args.cores} cores: {used:.0f} core-seconds busy, {args.cores * wall - used:.0f} idle")
    print("busy cores: " + " ".join(f"{t}s:{busy(jobs, t + 0.5)}" for t in range(0, int(wall), args.every)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
