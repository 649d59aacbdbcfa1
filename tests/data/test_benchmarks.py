"""Benchmark loaders: real files load with the right counts and sane answers; bad rows fail with file:line.

The real data is read from $QERL_TEST_DATA_ROOT, else from ../shared/data beside the checkout; tests that need it
are skipped (with the path tried) when it is absent.

Run: `pytest tests/data/test_benchmarks.py -q`
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from qerl.data.benchmarks import (
    BENCHMARK_FILES,
    DataFileMissingError,
    Problem,
    load_benchmark,
    load_jsonl,
    load_jsonl_problems,
    missing_files,
    solution_level,
)



EXPECTED_ROWS = [
    ("gsm8k", "train", 7473),
    ("gsm8k", "test", 1319),
    ("math500", "test", 500),
    ("aime24", "test", 30),
    ("aime25", "test", 30),
    ("amc23", "test", 40),
    ("math_train", "train", 4500),
]

_INTEGER = re.compile(r"-?\d+")
_GSM8K_NUMBER = re.compile(r"-?\d+(\.\d+)?")


@pytest.mark.parametrize("name, split, rows", EXPECTED_ROWS, ids=[f"{n}-{s}" for n, s, _ in EXPECTED_ROWS])
def test_real_benchmark_row_counts(shared_data_root, name, split, rows):
    problems = load_benchmark(name, shared_data_root, split)
    assert len(problems) == rows
    assert all(isinstance(p, Problem) and p.source == name for p in problems)
    assert len({p.id for p in problems}) == rows
    assert all(p.question.strip() and p.answer and p.answer == p.answer.strip() for p in problems)


def test_real_answers_are_sane(shared_data_root):
    gsm = load_benchmark("gsm8k", shared_data_root, "test")
    assert gsm[0].answer == "18"  # Janet's ducks
    assert all(_GSM8K_NUMBER.fullmatch(p.answer) for p in gsm)
    assert all("####" in p.solution for p in gsm) and all(p.level == solution_level(p.solution) for p in gsm)
    assert {p.level for p in gsm} <= {1, 2, 3, 4, 5}
    for name in ("aime24", "aime25"):
        answers = [int(p.answer) for p in load_benchmark(name, shared_data_root)]
        assert all(0 <= a <= 999 for a in answers)
    aime24 = load_benchmark("aime24", shared_data_root)
    assert aime24[0].answer == "204" and "25" in {p.answer for p in aime24}  # "025" normalized
    amc = load_benchmark("amc23", shared_data_root)
    assert amc[0].answer == "27" and all(_INTEGER.fullmatch(p.answer) for p in amc)
    for name in ("math500", "math_train"):
        problems = load_benchmark(name, shared_data_root)
        assert {p.level for p in problems} == {1, 2, 3, 4, 5}
        assert all(p.solution and "\\boxed" in p.solution for p in problems)


def test_split_default_levels_and_limit(shared_data_root):
    assert len(load_benchmark("gsm8k", shared_data_root)) == 1319  # test is the default split
    assert len(load_benchmark("math_train", shared_data_root)) == 4500  # the only split
    hard = load_benchmark("math500", shared_data_root, levels=[3, 4, 5])
    assert hard and all(p.level in (3, 4, 5) for p in hard)
    assert len(hard) == sum(1 for p in load_benchmark("math500", shared_data_root) if p.level >= 3)
    level5 = [p.id for p in load_benchmark("math500", shared_data_root) if p.level == 5]
    assert [p.id for p in load_benchmark("math500", shared_data_root, levels=[5], limit=3)] == level5[:3]
    with pytest.raises(ValueError, match="no 'level' field"):
        load_benchmark("aime24", shared_data_root, levels=[3])
    short = load_benchmark("gsm8k", shared_data_root, split="train", levels=[2])  # GSM8K: solution lines
    assert len(short) == 1961 and all(p.solution.count("\n") == 2 for p in short[:50])


def test_math500_and_math_train_are_disjoint(shared_data_root):
    test = {p.question.strip() for p in load_benchmark("math500", shared_data_root)}
    train = {p.question.strip() for p in load_benchmark("math_train", shared_data_root)}
    assert not test & train


def test_missing_files_real_root_is_empty(shared_data_root):
    assert missing_files(shared_data_root, list(BENCHMARK_FILES)) == []


# ---------------------------------------------------------------------------------------------------- synthetic


def _write(root: Path, rel: str, lines: list[str]) -> Path:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(line + "\n" for line in lines))
    return path


GOOD_GSM = json.dumps({"question": "1+1?", "answer": "1+1=2\n#### 2"})
GOOD_MATH = json.dumps({"problem": "p", "solution": "so \\boxed{\\frac{1}{2}}", "answer": "\\frac{1}{2}", "level": 3})
GOOD_AIME = json.dumps({"problem": "p", "answer": "025"})
GOOD_AMC = json.dumps({"question": "p", "answer": 27.0})


def _math(**fields) -> str:
    row = {"problem": "p", "solution": "\\boxed{1}", "answer": "1", "level": 1}
    row.update(fields)
    return json.dumps({k: v for k, v in row.items() if v is not None})


BAD_ROWS = [
    ("gsm8k", "gsm8k/test.jsonl", GOOD_GSM, '{"question": "x", "answer": ', "not valid JSON"),
    ("gsm8k", "gsm8k/test.jsonl", GOOD_GSM, '["a list"]', "expected a JSON object"),
    ("gsm8k", "gsm8k/test.jsonl", GOOD_GSM, json.dumps({"question": "x"}), "missing field 'answer'"),
    ("gsm8k", "gsm8k/test.jsonl", GOOD_GSM, json.dumps({"question": 3, "answer": "#### 3"}), "field 'question'"),
    ("gsm8k", "gsm8k/test.jsonl", GOOD_GSM, json.dumps({"question": "x", "answer": "no marker"}), "'####'"),
    ("gsm8k", "gsm8k/test.jsonl", GOOD_GSM, json.dumps({"question": "", "answer": "#### 1"}), "is empty"),
    ("math500", "math500/test.jsonl", GOOD_MATH, _math(level=7), "out of range"),
    ("math500", "math500/test.jsonl", GOOD_MATH, _math(level="3"), "field 'level'"),
    ("math500", "math500/test.jsonl", GOOD_MATH, _math(level=None), "missing field 'level'"),
    ("math500", "math500/test.jsonl", GOOD_MATH, _math(answer="2"), "disagrees"),
    ("math_train", "math_train/train.jsonl", GOOD_MATH, _math(solution="s", answer="  "), "is empty"),
    ("aime24", "aime24/test.jsonl", GOOD_AIME, json.dumps({"problem": "p", "answer": None}), "field 'answer'"),
    ("aime25", "aime25/test.jsonl", GOOD_AIME, json.dumps({"answer": "3"}), "missing field 'problem' or 'question'"),
    ("amc23", "amc23/test.jsonl", GOOD_AMC, json.dumps({"question": "p", "answer": True}), "field 'answer'"),
    ("amc23", "amc23/test.jsonl", GOOD_AMC, json.dumps({"question": "p", "answer": ""}), "is empty"),
]


@pytest.mark.parametrize(
    "name, rel, good, bad, message",
    BAD_ROWS,
    ids=[
        "bad-json", "not-object", "missing-field", "wrong-type", "no-final-answer", "empty-question",
        "level-range", "level-type", "level-missing", "boxed-mismatch", "empty-answer", "answer-null",
        "no-problem", "answer-bool", "answer-empty-str",
    ],
)
def test_bad_row_names_file_line_field(tmp_path, name, rel, good, bad, message):
    path = _write(tmp_path, rel, [good, "", good, bad, good])
    with pytest.raises(ValueError) as info:
        load_benchmark(name, tmp_path)
    text = str(info.value)
    assert f"{path.resolve()}:4" in text  # the blank line still counts
    assert message in text


def test_error_shows_value_seen(tmp_path):
    _write(tmp_path, "math500/test.jsonl", [json.dumps({"problem": "p", "solution": "s", "answer": "1", "level": 9})])
    with pytest.raises(ValueError, match=r"field 'level'.*value seen: 9"):
        load_benchmark("math500", tmp_path)


def test_competition_answers_normalized(tmp_path):
    _write(tmp_path, "aime24/test.jsonl", [GOOD_AIME, json.dumps({"question": "q", "answer": 7, "solution": "s"})])
    _write(tmp_path, "amc23/test.jsonl", [GOOD_AMC, json.dumps({"problem": "q", "answer": "-1.0"})])
    aime = load_benchmark("aime24", tmp_path)
    assert [p.answer for p in aime] == ["25", "7"] and aime[1].solution == "s"
    assert [p.answer for p in load_benchmark("amc23", tmp_path)] == ["27", "-1"]


def test_gsm8k_answer_parsing(tmp_path):
    rows = [
        {"question": "a", "answer": "Work 1,000 + 1 = 1,001\n#### 1,001"},
        {"question": "b", "answer": "x\n#### -4."},
        {"question": "c", "answer": "x\n#### 0.50"},
    ]
    _write(tmp_path, "gsm8k/train.jsonl", [json.dumps(r) for r in rows])
    problems = load_benchmark("gsm8k", tmp_path, "train")
    assert [p.answer for p in problems] == ["1001", "-4", "0.5"]
    assert problems[0].solution == rows[0]["answer"]
    assert problems[0].id == "gsm8k/train/0"


def test_unknown_benchmark_and_split(tmp_path):
    with pytest.raises(ValueError, match=r"unknown benchmark 'gsm9k'.*aime24"):
        load_benchmark("gsm9k", tmp_path)
    with pytest.raises(ValueError, match="has no split 'train'"):
        load_benchmark("math500", tmp_path, "train")
    with pytest.raises(ValueError, match="unknown benchmark"):
        missing_files(tmp_path, ["nope"])


def test_missing_file_names_path_and_remedy(tmp_path):
    with pytest.raises(ValueError) as info:
        load_benchmark("amc23", tmp_path)
    assert isinstance(info.value, FileNotFoundError) and isinstance(info.value, DataFileMissingError)
    assert str((tmp_path / "amc23" / "test.jsonl").resolve()) in str(info.value)
    assert "qerl data --config" in str(info.value)


def test_empty_file_is_an_error(tmp_path):
    _write(tmp_path, "aime25/test.jsonl", [""])
    with pytest.raises(ValueError, match="has no rows"):
        load_benchmark("aime25", tmp_path)


def test_missing_files_lists_every_split(tmp_path):
    _write(tmp_path, "gsm8k/test.jsonl", [GOOD_GSM])
    assert missing_files(tmp_path, ["gsm8k", "math500"]) == ["gsm8k/train.jsonl", "math500/test.jsonl"]
    assert missing_files(tmp_path, []) == []


def test_load_jsonl(tmp_path):
    path = _write(tmp_path, "x.jsonl", ['{"a": 1}', "   ", '{"b": 2}'])
    assert load_jsonl(path) == [{"a": 1}, {"b": 2}]
    _write(tmp_path, "y.jsonl", ['{"a": 1}', "{oops}"])
    with pytest.raises(ValueError, match=r"y\.jsonl:2: not valid JSON"):
        load_jsonl(tmp_path / "y.jsonl")
    with pytest.raises(FileNotFoundError):
        load_jsonl(tmp_path / "absent.jsonl")


def test_a_control_character_is_named_once(tmp_path):
    """json's message "Invalid control character at" ends in "at": wrapped with the column it read "at at"."""
    _write(tmp_path, "z.jsonl", ['{"question": "a\tb", "answer": "1"}'])
    with pytest.raises(ValueError) as err:
        load_jsonl(tmp_path / "z.jsonl")
    assert "z.jsonl:1: not valid JSON (Invalid control character at column 16); line starts" in str(err.value)
    assert "at at" not in str(err.value)


def test_load_jsonl_problems_tiny_format(tmp_path):
    rows = [
        {"id": "t-0", "question": "Tom has 2 apples and buys 3. How many?", "answer": "2 + 3 = 5\n#### 5",
         "level": 1, "final": "5"},
        {"question": "q2", "answer": "#### 12", "level": 3},
        {"question": "q3", "answer": "#### 7", "level": 5, "final": 7},
    ]
    path = _write(tmp_path, "tiny/test.jsonl", [json.dumps(r) for r in rows])
    problems = load_jsonl_problems(path, "tiny")
    assert [(p.id, p.answer, p.level, p.source) for p in problems] == [
        ("t-0", "5", 1, "tiny"), ("tiny/test/1", "12", 3, "tiny"), ("tiny/test/2", "7", 5, "tiny")]
    assert [p.answer for p in load_jsonl_problems(path, "tiny", levels=[3, 5], limit=1)] == ["12"]
    _write(tmp_path, "bad.jsonl", [json.dumps({"question": "q", "answer": "#### 5", "final": "6"})])
    with pytest.raises(ValueError, match=r"bad\.jsonl:1: field 'final'"):
        load_jsonl_problems(tmp_path / "bad.jsonl", "tiny")
    _write(tmp_path, "bad2.jsonl", [json.dumps({"question": "q", "answer": "#### 5", "level": 0})])
    with pytest.raises(ValueError, match=r"bad2\.jsonl:1: field 'level'.*value seen: 0"):
        load_jsonl_problems(tmp_path / "bad2.jsonl", "tiny")


def test_bad_arguments(tmp_path):
    _write(tmp_path, "math500/test.jsonl", [GOOD_MATH])
    with pytest.raises(ValueError, match="levels must be integers 1-5"):
        load_benchmark("math500", tmp_path, levels=[6])
    with pytest.raises(ValueError, match="limit"):
        load_benchmark("math500", tmp_path, limit=-1)
