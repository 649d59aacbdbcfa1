"""Benchmark loaders with row validation: GSM8K, MATH-500, AIME 2024/2025, AMC 23 and the MATH training remainder.

Why: training, evaluation and the tables must read the same problems with the same reference answers, and a bad
file must fail loudly at the row that is wrong (``file:line``, the field and the value seen) instead of silently
scoring zero. Every benchmark lives at ``<data root>/<name>/<split>.jsonl`` (see ``BENCHMARK_FILES``); the files
are the public ones described in ``data/SOURCES.md`` of the shared data folder, or what ``qerl data`` downloads.

Reference answers are the benchmark's own ``answer`` field, lightly normalized where the answer is a plain number
(GSM8K's ``#### 1,000`` -> ``1000``, AIME's ``025`` -> ``25``, AMC's ``27.0`` -> ``27``); MATH answers are LaTeX and
are kept verbatim (stripped), after checking they agree with the last ``\\boxed{}`` of the solution.

Usage::

    from qerl.data.benchmarks import load_benchmark
    problems = load_benchmark("math500", "resources/data", levels=[3, 4, 5], limit=100)

Run the tests: ``pytest tests/data/test_benchmarks.py -q``.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator

from qerl.contract.records import json_error
from qerl.contract.paths import BENCHMARK_FILES, HELD_OUT, benchmark_splits, missing_files
from qerl.data.answers import gsm8k_final_answer, last_boxed, normalize_number

__all__ = [
    "HELD_OUT",
    "Problem",
    "BENCHMARK_FILES",
    "BENCHMARK_FIELDS",
    "DataFileMissingError",
    "iter_jsonl",
    "load_jsonl",
    "load_benchmark",
    "load_jsonl_problems",
    "missing_files",
    "default_split",
    "benchmark_path",
    "parse_row",
    "solution_level",
]

#: benchmark name -> the fields each row needs (``a|b``: either one), for error messages and for `qerl data`.
BENCHMARK_FIELDS: dict[str, str] = {
    "gsm8k": "question (str), answer (str, a worked solution ending in '#### N')",
    "math500": "problem (str), solution (str), answer (str), level (int 1-5)",
    "aime24": "problem|question (str), answer (str or int)",
    "aime25": "problem|question (str), answer (str or int)",
    "amc23": "problem|question (str), answer (number or str)",
    "math_train": "problem (str), solution (str), answer (str), level (int 1-5)",
}

_VALUE_PREVIEW = 80


class DataFileMissingError(FileNotFoundError, ValueError):
    """A benchmark file is not where the config says; both a FileNotFoundError and a ValueError (bad config/data)."""


@dataclass(frozen=True)
class Problem:
    """One benchmark problem.

    Attributes:
        id: stable identifier, ``<source>/<split>/<row index>`` unless the file gives one.
        question: the problem statement shown to the model.
        answer: the reference final answer (normalized for numeric benchmarks).
        level: difficulty 1-5 where the benchmark has one (MATH, the tiny scale), else None.
        solution: the worked solution where the benchmark has one, else None.
        source: the benchmark name (``gsm8k``, ``math500``, ...).
    """

    id: str
    question: str
    answer: str
    level: int | None
    solution: str | None
    source: str


# --------------------------------------------------------------------------------------------------------------
# JSONL reading


def _preview(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= _VALUE_PREVIEW else text[: _VALUE_PREVIEW - 3] + "..."


def iter_jsonl(path: str | Path) -> Iterator[tuple[int, dict]]:
    """Yield ``(line number, row)`` for every non-blank line of a JSONL file.

    Args:
        path: the file.

    Yields:
        1-based line number and the parsed JSON object.

    Raises:
        DataFileMissingError: if the file does not exist (a ValueError and a FileNotFoundError).
        ValueError: ``file:line`` for a line that is not valid JSON or not a JSON object.
    """
    path = Path(path)
    if not path.is_file():
        raise DataFileMissingError(f"{path}: file not found")
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(
                    f"{path}:{lineno}: not valid JSON ({json_error(exc)}); line starts "
                    f"{_preview(line.strip())}"
                ) from None
            if not isinstance(row, dict):
                raise ValueError(
                    f"{path}:{lineno}: expected a JSON object, got {type(row).__name__} {_preview(row)}"
                )
            yield lineno, row


def load_jsonl(path: str | Path) -> list[dict]:
    """Read a JSONL file into a list of dicts (blank lines skipped).

    Args:
        path: the file.

    Returns:
        The rows, in file order.

    Raises:
        DataFileMissingError: if the file does not exist.
        ValueError: naming ``file:line`` for a line that is not a JSON object.
    """
    return [row for _, row in iter_jsonl(path)]


# --------------------------------------------------------------------------------------------------------------
# Field validation


def _field_error(where: str, field: str, problem: str, value: Any = ...) -> ValueError:
    seen = "" if value is ... else f"; value seen: {_preview(value)}"
    return ValueError(f"{where}: field {field!r}: {problem}{seen}")


def _require_str(row: dict, where: str, *fields: str, allow_empty: bool = False) -> str:
    """The first of `fields` present in `row`, which must be a (non-empty) string."""
    for field in fields:
        if field in row:
            value = row[field]
            if not isinstance(value, str):
                raise _field_error(where, field, f"expected a string, got {type(value).__name__}", value)
            if not allow_empty and not value.strip():
                raise _field_error(where, field, "is empty", value)
            return value
    names = " or ".join(repr(f) for f in fields)
    raise ValueError(f"{where}: missing field {names}; fields present: {sorted(row)}")


def _optional_str(row: dict, where: str, field: str) -> str | None:
    if field not in row or row[field] is None:
        return None
    value = row[field]
    if not isinstance(value, str):
        raise _field_error(where, field, f"expected a string, got {type(value).__name__}", value)
    return value


def _require_level(row: dict, where: str, required: bool) -> int | None:
    if "level" not in row or row["level"] is None:
        if required:
            raise ValueError(f"{where}: missing field 'level'; fields present: {sorted(row)}")
        return None
    value = row["level"]
    if isinstance(value, bool) or not isinstance(value, int):
        raise _field_error(where, "level", f"expected an integer 1-5, got {type(value).__name__}", value)
    if not 1 <= value <= 5:
        raise _field_error(where, "level", "out of range 1-5", value)
    return value


def _numeric_answer(row: dict, where: str, field: str = "answer") -> str:
    """A competition answer given as str, int or float, normalized to its canonical text."""
    if field not in row:
        raise ValueError(f"{where}: missing field {field!r}; fields present: {sorted(row)}")
    value = row[field]
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise _field_error(where, field, f"expected a string or number, got {type(value).__name__}", value)
    if isinstance(value, float) and value != value:  # NaN
        raise _field_error(where, field, "is NaN", value)
    text = normalize_number(value)
    if not text:
        raise _field_error(where, field, "is empty", value)
    return text


def _gsm8k_fields(row: dict, where: str) -> tuple[str, str, str]:
    """(question, normalized final answer, full solution) of a GSM8K-format row."""
    question = _require_str(row, where, "question")
    solution = _require_str(row, where, "answer")
    final = gsm8k_final_answer(solution)
    if final is None:
        raise _field_error(where, "answer", "has no final answer after '####'", solution[-_VALUE_PREVIEW:])
    return question, normalize_number(final), solution


def _math_fields(row: dict, where: str) -> tuple[str, str, str | None]:
    """(problem, answer, solution) of a MATH-format row; the answer must match the solution's last \\boxed{}."""
    question = _require_str(row, where, "problem")
    answer = _require_str(row, where, "answer").strip()
    solution = _optional_str(row, where, "solution")
    if solution is not None:
        boxed = last_boxed(solution)
        if boxed is not None and boxed != answer:
            raise _field_error(
                where, "answer", f"disagrees with the last \\boxed{{}} of 'solution' ({_preview(boxed)})", answer
            )
    return question, answer, solution


def default_split(name: str) -> str:
    """The split `load_benchmark` reads when none is given: ``test`` where there is one, else the only split.

    Args:
        name: a benchmark name from ``BENCHMARK_FILES``.

    Returns:
        The split name.

    Raises:
        ValueError: for an unknown benchmark.
    """
    splits = benchmark_splits(name)
    return "test" if "test" in splits else next(iter(splits))


def solution_level(solution: str) -> int:
    """A GSM8K problem's difficulty level: the calculation lines of its worked solution (the non-empty lines before
    '#### N'), capped at 5 (GSM8K has no levels of its own; its solutions take 2-8 steps). The small scale trains
    on the short ones (`levels` of a task) and reports held-out pass@1 per level."""
    steps = [line for line in solution.rpartition("####")[0].splitlines() if line.strip()]
    return max(1, min(5, len(steps)))


def parse_row(name: str, row: dict, where: str, index: int, split: str) -> Problem:
    """Validate one row of benchmark `name` and turn it into a Problem.

    Args:
        name: benchmark name (a key of ``BENCHMARK_FILES``).
        row: the parsed JSON object.
        where: ``file:line`` for error messages.
        index: 0-based row index within the file (used in the id).
        split: the split the row comes from (used in the id).

    Returns:
        The Problem.

    Raises:
        ValueError: naming `where`, the field and the value seen, for a missing field, a wrong type, an empty
            answer, a level outside 1-5 or a MATH answer that disagrees with its solution's last box.
    """
    pid = f"{name}/{split}/{index}"
    if name == "gsm8k":
        question, answer, solution = _gsm8k_fields(row, where)
        level = _require_level(row, where, required=False)
        return Problem(pid, question, answer, solution_level(solution) if level is None else level, solution, name)
    if name in ("math500", "math_train"):
        question, answer, solution = _math_fields(row, where)
        return Problem(pid, question, answer, _require_level(row, where, required=True), solution, name)
    if name in ("aime24", "aime25", "amc23"):
        question = _require_str(row, where, "problem", "question")
        answer = _numeric_answer(row, where)
        solution = _optional_str(row, where, "solution")
        return Problem(pid, question, answer, None, solution, name)
    benchmark_splits(name)  # raises the unknown-benchmark error
    raise AssertionError(f"no row parser for benchmark {name!r}")  # pragma: no cover - BENCHMARK_FILES drift


# --------------------------------------------------------------------------------------------------------------
# Loading


def _missing_message(path: Path, name: str, split: str) -> str:
    return (
        f"{path}: benchmark file for {name!r} split {split!r} is missing. Get it with "
        f"`qerl data --config <your config> --out <manifest.json>` (downloads it when online and data.download is "
        f"true), or put the JSONL file there yourself: one JSON object per line with {BENCHMARK_FIELDS[name]}."
    )


def benchmark_path(name: str, root: str | Path, split: str | None = None) -> Path:
    """Absolute path of a benchmark file.

    Args:
        name: benchmark name.
        root: the data root folder.
        split: the split; None picks ``default_split(name)``.

    Returns:
        ``<root>/<relative path>``, resolved.

    Raises:
        ValueError: for an unknown benchmark or split.
    """
    splits = benchmark_splits(name)
    split = default_split(name) if split is None else split
    if split not in splits:
        raise ValueError(f"benchmark {name!r} has no split {split!r}; splits: {sorted(splits)}")
    return (Path(root) / splits[split]).resolve()


def _filter(problems: Iterable[Problem], where: str, levels: Iterable[int] | None, limit: int | None) -> list[Problem]:
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
        raise ValueError(f"limit must be a non-negative integer or None, got {limit!r}")
    out = list(problems)
    if levels is not None:
        wanted = set(levels)
        bad = sorted(v for v in wanted if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= 5)
        if bad:
            raise ValueError(f"levels must be integers 1-5, got {sorted(wanted, key=repr)!r}")
        if out and all(p.level is None for p in out):
            raise ValueError(f"{where}: levels={sorted(wanted)} asked for, but this data has no 'level' field")
        out = [p for p in out if p.level in wanted]
    if limit is not None:
        out = out[:limit]
    return out


def load_benchmark(
    name: str,
    root: str | Path,
    split: str | None = None,
    levels: Iterable[int] | None = None,
    limit: int | None = None,
) -> list[Problem]:
    """Load and validate every row of one benchmark split.

    Args:
        name: one of ``BENCHMARK_FILES`` (gsm8k, math500, aime24, aime25, amc23, math_train).
        root: the data root (``data.root`` in the config).
        split: ``train`` or ``test``; None picks ``test`` where it exists, else the only split.
        levels: keep only problems of these difficulty levels (MATH-style benchmarks only).
        limit: keep the first `limit` problems (after the level filter).

    Returns:
        The problems, in file order.

    Raises:
        ValueError: unknown benchmark or split (naming the known ones); a missing file (a DataFileMissingError
            naming the full path and how to get it); any invalid row (``file:line``, field, value seen);
            `levels` given for a benchmark without levels.
    """
    path = benchmark_path(name, root, split)
    split = default_split(name) if split is None else split
    if not path.is_file():
        raise DataFileMissingError(_missing_message(path, name, split))
    problems = [
        parse_row(name, row, f"{path}:{lineno}", index, split)
        for index, (lineno, row) in enumerate(iter_jsonl(path))
    ]
    if not problems:
        raise ValueError(f"{path}: benchmark file for {name!r} split {split!r} has no rows")
    return _filter(problems, str(path), levels, limit)


def load_jsonl_problems(
    path: str | Path,
    source: str,
    levels: Iterable[int] | None = None,
    limit: int | None = None,
) -> list[Problem]:
    """Load GSM8K-format problems (e.g. the tiny scale's generated ones) from any JSONL file.

    Each row needs ``question`` and ``answer`` (a worked solution ending in ``#### N``); optional fields:
    ``level`` (int 1-5), ``id`` (str or int; default ``<source>/<file stem>/<row index>``) and ``final`` (the
    answer N as text, checked against the ``####`` answer when present).

    Args:
        path: the JSONL file.
        source: the name stored in ``Problem.source`` (e.g. ``"tiny"``).
        levels: keep only these levels (the rows must have a ``level``).
        limit: keep the first `limit` problems (after the level filter).

    Returns:
        The problems, in file order.

    Raises:
        ValueError: missing file (DataFileMissingError), invalid row (``file:line``, field, value seen), or
            ``levels`` given for rows without levels.
    """
    path = Path(path)
    problems = []
    for index, (lineno, row) in enumerate(iter_jsonl(path)):
        where = f"{path}:{lineno}"
        question, answer, solution = _gsm8k_fields(row, where)
        level = _require_level(row, where, required=False)
        if "final" in row:
            final = row["final"]
            if isinstance(final, bool) or not isinstance(final, (str, int, float)):
                raise _field_error(where, "final", f"expected a string or number, got {type(final).__name__}", final)
            if normalize_number(final) != answer:
                raise _field_error(where, "final", f"disagrees with the '####' answer {answer!r}", final)
        pid = row.get("id", f"{source}/{path.stem}/{index}")
        if isinstance(pid, bool) or not isinstance(pid, (str, int)):
            raise _field_error(where, "id", f"expected a string or integer, got {type(pid).__name__}", pid)
        problems.append(Problem(str(pid), question, answer, level, solution, source))
    return _filter(problems, str(path), levels, limit)
