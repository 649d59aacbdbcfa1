"""A self-test of the answer grader on each benchmark's own reference answers.

Why: a pass@1 number is only as good as the grader behind it. If a benchmark's gold answers do not verify against
themselves (a LaTeX form math-verify cannot parse, a number with a unit, an AMC float) the model is scored wrong for
being right; if unrelated answers verify as equal the model is scored right for being wrong. This check runs the
exact reward path used in training and evaluation (`qerl.rl.rewards.accuracy_reward`: answer extraction, then
math-verify) on two synthetic "model outputs" per problem:
    gold      "<answer>GOLD</answer>" for its own problem                 -> must grade 100.0 %
    shuffled  the answers permuted across problems (fixed seed, no problem keeps its own answer)
                                                                         -> must grade below --max-shuffled (10 %)
Shuffled matches are not all grader errors: problems can share an answer (GSM8K has many small integers), which is
why the bar is "about 0", not 0.

Run (qerl/commands/grade_check.py):
    qerl grade-check --benchmarks gsm8k math500 aime24 aime25 amc23 --data-root ../shared/data
    pytest tests/evaluate/test_grade_check.py -q
Exit status 0 when every benchmark passes, 1 otherwise; `--out FILE` also writes the numbers as JSON.
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

__all__ = ["GradeCheck", "check_answers", "check_benchmark"]


@dataclass
class GradeCheck:
    """The outcome for one benchmark.

    Attributes:
        benchmark: its name.
        n: number of problems.
        gold_correct: problems whose own answer graded correct.
        shuffled_correct: problems whose permuted (foreign) answer graded correct.
        gold_failures: (problem id, answer) of gold answers that did not verify (the first 20).
        shuffled_matches: (problem id, its answer, the foreign answer) accepted as equal (the first 20).
    """

    benchmark: str
    n: int
    gold_correct: int
    shuffled_correct: int
    gold_failures: list[tuple[str, str]] = field(default_factory=list)
    shuffled_matches: list[tuple[str, str, str]] = field(default_factory=list)

    @property
    def gold_pct(self) -> float:
        return 100.0 * self.gold_correct / self.n

    @property
    def shuffled_pct(self) -> float:
        return 100.0 * self.shuffled_correct / self.n

    def passed(self, max_shuffled_pct: float = 10.0) -> bool:
        """Gold at 100 % and shuffled below `max_shuffled_pct`."""
        return self.gold_correct == self.n and self.shuffled_pct < max_shuffled_pct


def _derangement(n: int, seed: int) -> list[int]:
    """A permutation with no fixed point: shuffle, then send each shuffled position to the next one."""
    order = list(range(n))
    random.Random(seed).shuffle(order)
    target = [0] * n
    for i in range(n):
        target[order[i]] = order[(i + 1) % n]
    return target


def check_answers(
    benchmark: str, ids: Sequence[str], answers: Sequence[str], seed: int = 0, timeout_s: int | None = 3,
    keep: int = 20,
) -> GradeCheck:
    """Grade each gold answer against itself and a seeded permutation of the answers against the originals.

    Args:
        benchmark: name for the report.
        ids: problem ids.
        answers: reference answers, one per problem.
        seed: permutation seed.
        timeout_s: math-verify timeout per answer (see `qerl.rl.rewards.is_correct`).
        keep: how many failures/matches to keep for the report.

    Returns:
        A GradeCheck.

    Raises:
        ValueError: if there are fewer than 2 answers or ids and answers differ in length.
    """
    from qerl.rl.rewards import accuracy_reward

    if len(ids) != len(answers):
        raise ValueError(f"{benchmark}: {len(ids)} ids but {len(answers)} answers")
    if len(answers) < 2:
        raise ValueError(f"{benchmark}: need at least 2 problems to shuffle answers, got {len(answers)}")
    result = GradeCheck(benchmark, len(answers), 0, 0)
    for pid, gold in zip(ids, answers):
        if accuracy_reward(f"<answer>{gold}</answer>", gold, timeout_s=timeout_s) == 1.0:
            result.gold_correct += 1
        elif len(result.gold_failures) < keep:
            result.gold_failures.append((pid, gold))
    for i, j in enumerate(_derangement(len(answers), seed)):
        if accuracy_reward(f"<answer>{answers[j]}</answer>", answers[i], timeout_s=timeout_s) == 1.0:
            result.shuffled_correct += 1
            if len(result.shuffled_matches) < keep:
                result.shuffled_matches.append((ids[i], answers[i], answers[j]))
    return result


def check_benchmark(name: str, root: str | Path, split: str | None = None, seed: int = 0,
                    timeout_s: int | None = 3) -> GradeCheck:
    """Load benchmark `name` with `qerl.data.benchmarks.load_benchmark` and run `check_answers` on it.

    Args:
        name: benchmark name (gsm8k, math500, aime24, aime25, amc23, math_train).
        root: data root.
        split: split (None: test where there is one).
        seed: permutation seed.
        timeout_s: math-verify timeout per answer.

    Returns:
        A GradeCheck.

    Raises:
        ValueError: from the loader (unknown benchmark, missing file, bad row) or `check_answers`.
    """
    from qerl.data.benchmarks import load_benchmark

    problems = load_benchmark(name, root, split=split)
    return check_answers(name, [str(p.id) for p in problems], [p.answer for p in problems], seed, timeout_s)
