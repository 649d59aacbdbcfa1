"""`qerl grade-check --benchmarks NAME... --data-root DIR`: the grader's self-check (qerl.evaluate.grade_check):
gold answers must grade 100 %, shuffled answers about 0 %. Exit 1 when a benchmark fails."""
from __future__ import annotations

import sys
from dataclasses import asdict

from qerl.args import add_list
from qerl.evaluate.grade_check import check_benchmark
from qerl.io import write_json

__all__ = ["RENAMED", "add_arguments", "run"]

RENAMED = {"--benchmark": "--benchmarks", "--output": "--out"}  # old spellings still work (qerl.args.parse_args)


def add_arguments(parser) -> None:
    """Arguments of `qerl grade-check`."""
    add_list(parser, "--benchmarks", required=True, metavar="NAME",
             help="benchmark(s): gsm8k math500 aime24 aime25 amc23 math_train")
    parser.add_argument("--data-root", required=True, help="folder holding <benchmark>/<split>.jsonl")
    parser.add_argument("--split", default=None, help="split to read (default: test where there is one)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the answer permutation (default 0)")
    parser.add_argument("--max-shuffled", type=float, default=10.0, metavar="PCT",
                        help="fail when shuffled answers grade correct this often or more, in %% (default 10)")
    parser.add_argument("--timeout-s", type=int, default=3, help="math-verify timeout per answer, seconds")
    parser.add_argument("--out", default=None, metavar="FILE", help="also write the results as JSON to this file")


def run(args) -> int:
    results = []
    for name in args.benchmarks:
        res = check_benchmark(name, args.data_root, args.split, args.seed, args.timeout_s)
        ok = res.passed(args.max_shuffled)
        print(f"{name}: n={res.n} gold {res.gold_pct:.1f} % ({res.gold_correct}/{res.n})  "
              f"shuffled {res.shuffled_pct:.1f} % ({res.shuffled_correct}/{res.n})  {'OK' if ok else 'FAIL'}")
        for pid, gold in res.gold_failures:
            print(f"  gold does not verify against itself: id={pid} answer={gold!r}")
        if not ok:
            for pid, gold, other in res.shuffled_matches:
                print(f"  foreign answer accepted: id={pid} gold={gold!r} given={other!r}")
        results.append((res, ok))
    if args.out:
        write_json(args.out, [
            {**asdict(r), "gold_pct": r.gold_pct, "shuffled_pct": r.shuffled_pct, "passed": ok} for r, ok in results
        ])
    sys.stdout.flush()
    return 0 if all(ok for _, ok in results) else 1
