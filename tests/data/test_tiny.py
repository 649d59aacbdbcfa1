"""The tiny scale's generator: deterministic, well-formed, correct arithmetic, disjoint test split."""
from __future__ import annotations

import hashlib
import random

import pytest

from qerl.data.answers import gsm8k_final_answer
from qerl.data.benchmarks import load_jsonl_problems
from qerl.data.tiny import generate_problem, write_splits


def _digest(folder):
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


def test_same_seed_identical_files(tmp_path):
    write_splits(tmp_path / "a", 7, 300, 50, 10, [1, 2, 3, 4, 5])
    write_splits(tmp_path / "b", 7, 300, 50, 10, [1, 2, 3, 4, 5])
    write_splits(tmp_path / "c", 8, 300, 50, 10, [1, 2, 3, 4, 5])
    assert _digest(tmp_path / "a") == _digest(tmp_path / "b")
    assert _digest(tmp_path / "a") != _digest(tmp_path / "c")


@pytest.mark.parametrize("level", [1, 2, 3, 4, 5])
def test_worked_solution_is_correct_arithmetic(level):
    rng = random.Random(level)
    for _ in range(200):
        row = generate_problem(rng, level)
        steps = row["answer"].split("####")[0].strip(" .\n").split(" . ")
        assert len(steps) == level
        value = None
        for step in steps:
            a, op, b, eq, c = step.split()
            assert eq == "="
            a, b, c = int(a), int(b), int(c)
            assert value is None or a == value
            assert c == {"+": a + b, "-": a - b, "*": a * b}[op]
            assert 0 <= c <= 99
            value = c
        assert row["final"] == str(value) == gsm8k_final_answer(row["answer"])


def test_test_split_disjoint_and_loadable(tmp_path):
    counts = write_splits(tmp_path, 3, 2000, 200, 20, [1, 2, 3, 4, 5])
    assert counts["test"] == 100
    test = load_jsonl_problems(tmp_path / "test.jsonl", "tiny")
    train = load_jsonl_problems(tmp_path / "pretrain.jsonl", "tiny")
    assert {p.level for p in test} == {1, 2, 3, 4, 5}
    assert not {p.question for p in test} & {p.question for p in train}


def test_bad_level_rejected():
    with pytest.raises(ValueError, match="level must be in 1-5"):
        generate_problem(random.Random(0), 6)
