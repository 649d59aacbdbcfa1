"""Conversion of public hub rows to our JSONL fields, one converter per benchmark (pure; tested on in-memory rows).

`qerl.data.fetch` downloads a missing benchmark file from its hub source and converts the rows here; every converted
row then goes through the loader's row check (`qerl.data.benchmarks`) before anything is written. The MATH training
remainder (math_train) is built, as in data/SOURCES.md, from the MATH test set minus the 500 MATH-500 problems.

Run the tests: ``pytest tests/data/test_fetch.py -q``.
"""
from __future__ import annotations

import re
from typing import Any, Iterable

from qerl.data.answers import last_boxed

__all__ = [
    "convert_gsm8k",
    "convert_math500",
    "convert_competition",
    "convert_math_train",
]


def _first(row: dict, *keys: str) -> Any:
    for key in keys:
        if key in row and row[key] is not None:
            return row[key]
    return None


def convert_gsm8k(rows: Iterable[dict]) -> list[dict]:
    """GSM8K hub rows -> ``{"question", "answer"}`` (the answer keeps the worked solution and ``#### N``).

    Args:
        rows: hub rows with ``question`` and ``answer``.

    Returns:
        Our rows.
    """
    return [{"question": r.get("question"), "answer": r.get("answer")} for r in rows]


def convert_math500(rows: Iterable[dict]) -> list[dict]:
    """MATH-500 hub rows -> ``{"problem", "solution", "answer", "subject", "level", "unique_id"}``.

    A missing ``answer`` is taken from the solution's last ``\\boxed{}``; a level given as ``"Level 3"`` becomes 3.

    Args:
        rows: hub rows.

    Returns:
        Our rows.
    """
    out = []
    for r in rows:
        row = {
            "problem": r.get("problem"),
            "solution": r.get("solution"),
            "answer": _first(r, "answer"),
            "subject": _first(r, "subject", "type"),
            "level": _parse_level(r.get("level")),
            "unique_id": r.get("unique_id"),
        }
        if row["answer"] is None and isinstance(row["solution"], str):
            row["answer"] = last_boxed(row["solution"])
        out.append({k: v for k, v in row.items() if v is not None})
    return out


def convert_competition(rows: Iterable[dict]) -> list[dict]:
    """AIME / AMC hub rows -> ``{"problem", "answer"}`` plus ``id``, ``solution``, ``url`` where present.

    Accepts ``problem``/``question``/``Problem`` and ``answer``/``Answer`` spellings. Answers stay as given (str,
    int or float); the loader normalizes them.

    Args:
        rows: hub rows.

    Returns:
        Our rows.
    """
    out = []
    for r in rows:
        row = {
            "id": _first(r, "id", "ID", "problem_idx"),
            "problem": _first(r, "problem", "question", "Problem", "Question"),
            "solution": _first(r, "solution", "Solution"),
            "answer": _first(r, "answer", "Answer"),
            "url": _first(r, "url"),
        }
        out.append({k: v for k, v in row.items() if v is not None})
    return out


_LEVEL = re.compile(r"^\s*(?:level\s*)?([1-5])\s*$", re.IGNORECASE)


def _parse_level(value: Any) -> Any:
    """``3`` or ``"Level 3"`` -> 3; anything else is returned as is (and rejected by the loader)."""
    if isinstance(value, str):
        m = _LEVEL.match(value)
        return int(m.group(1)) if m else value
    return value


def convert_math_train(
    rows_by_subject: dict[str, list[dict]], exclude_problems: Iterable[str]
) -> tuple[list[dict], int]:
    """MATH test rows (per subject config) minus the MATH-500 problems -> our math_train rows.

    Rows whose level is not 1-5 (the MATH data has a few ``Level ?``) or whose solution has no ``\\boxed{}`` are
    dropped and counted.

    Args:
        rows_by_subject: subject config -> hub rows with ``problem``, ``solution``, ``level``, ``type``.
        exclude_problems: problem statements to leave out (MATH-500's).

    Returns:
        (our rows with ``problem``, ``solution``, ``answer``, ``level``, ``subject``; number of rows dropped).
    """
    excluded = {p.strip() for p in exclude_problems}
    out, dropped = [], 0
    for subject, rows in rows_by_subject.items():
        for r in rows:
            problem, solution = r.get("problem"), r.get("solution")
            if not isinstance(problem, str) or problem.strip() in excluded:
                continue
            level = _parse_level(r.get("level"))
            answer = last_boxed(solution) if isinstance(solution, str) else None
            if not isinstance(level, int) or not answer:
                dropped += 1
                continue
            out.append(
                {
                    "problem": problem,
                    "solution": solution,
                    "answer": answer,
                    "level": level,
                    "subject": r.get("type") or subject,
                }
            )
    return out, dropped
