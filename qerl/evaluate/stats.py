"""pass@1 over repeats and its standard error: the statistic every evaluation number is.

pass@1 of a problem is the fraction of its n samples whose extracted answer math-verify accepts; the benchmark's
pass@1 is the mean over problems (in %), with the standard error of that mean over problems
(sample std / sqrt(n problems)). `qerl.evaluate.run` recomputes it from the per-sample verdicts, and it must agree
with lm-eval's aggregate.

Run the tests: ``pytest tests/evaluate/test_run.py -q``.
"""
from __future__ import annotations

import math
from dataclasses import asdict
from typing import Sequence

from qerl.contract.records import PassAt1

__all__ = ["pass_at_1_stats"]


def pass_at_1_stats(correct: Sequence[Sequence[bool]]) -> dict:
    """pass@1 over repeats: per problem the fraction of its samples that are correct, then the mean over problems.

    Args:
        correct: one list of verdicts per problem, every list of the same length n (the repeats).

    Returns:
        The fields of qerl.contract.records.PassAt1, as a dict: "pass_at_1" (mean in %), "stderr" (standard error of
        that mean over problems in %: sample std with n-1, divided by sqrt(problems); None for a single problem),
        "n_problems", "n_repeats", "per_repeat" (accuracy in % of the k-th sample of every problem, k = 1..n).

    Raises:
        ValueError: no problems, or problems with different numbers of samples.
    """
    if not correct:
        raise ValueError("pass_at_1_stats: no problems")
    lengths = {len(c) for c in correct}
    if len(lengths) != 1 or 0 in lengths:
        raise ValueError(f"pass_at_1_stats: every problem needs the same positive number of samples, "
                         f"got {sorted(lengths)}")
    n_rep = lengths.pop()
    per_problem = [sum(map(bool, c)) / n_rep for c in correct]
    n = len(per_problem)
    mean = sum(per_problem) / n
    stderr = math.sqrt(sum((x - mean) ** 2 for x in per_problem) / (n - 1)) / math.sqrt(n) if n > 1 else None
    per_repeat = [100.0 * sum(bool(c[k]) for c in correct) / n for k in range(n_rep)]
    return asdict(PassAt1(pass_at_1=100.0 * mean, stderr=None if stderr is None else 100.0 * stderr, n_problems=n,
                          n_repeats=n_rep, per_repeat=per_repeat))
