"""Synthetic arithmetic word problems for the tiny scale, in GSM8K's format, with difficulty levels 1-5.

Why: the tiny scale must run every method on a CPU in minutes without downloads, yet keep the structure of the
paper's tasks: a word problem, a worked solution ending in `#### N` (GSM8K) and difficulty levels (BigMath's
levels 1-5, which the paper filters to 3-5). Level L takes L arithmetic steps; numbers stay small so a model of
~100k parameters can learn to do them digit by digit.

Each row: {"id", "question", "answer" (worked solution ending "#### N"), "level", "final"}; `final` is N as a string.
The same seed writes byte-identical files. Splits are drawn from disjoint seed streams (pretrain, rl, test), and a
question that appears in the test split is never written to the other two.

Run: `qerl gen-tiny --config config/config.yaml --out results/tiny/data`
"""
from __future__ import annotations

import json
import os
import random
from pathlib import Path

__all__ = ["NAMES", "ITEMS", "generate_problem", "generate_split", "write_splits", "vocabulary_words"]

NAMES = ["Ann", "Ben", "Cara", "Dan", "Eva", "Finn", "Gus", "Hana", "Ivy", "Jon", "Kim", "Leo", "Mia", "Ned", "Oli", "Pia"]
ITEMS = ["apples", "pens", "books", "coins", "cards", "eggs", "shells", "stamps", "cups", "rocks", "kites", "toys"]
_ADD = ["buys", "finds", "gets", "wins"]
_SUB = ["gives away", "loses", "eats", "sells"]
_MAX_VALUE = 99  # every intermediate result stays in [0, 99]


_OPERAND_MAX = 30  # operands of + and - (two digits, with carries and borrows)


def generate_problem(rng: random.Random, level: int) -> dict:
    """One problem of `level` steps.

    Args:
        rng: the random stream (the caller seeds it).
        level: number of arithmetic steps, 1-5.

    Returns:
        {"question", "answer", "level", "final"} in GSM8K's format.

    Raises:
        ValueError: if `level` is outside 1-5.
    """
    if not 1 <= level <= 5:
        raise ValueError(f"level must be in 1-5, got {level!r}")
    name, item = rng.choice(NAMES), rng.choice(ITEMS)
    value = rng.randint(1, _OPERAND_MAX)
    sentences = [f"{name} has {value} {item} ."]
    steps = []
    for _ in range(level):
        ops = ["add", "sub"] + (["mul"] if value <= _MAX_VALUE // 2 else [])
        op = rng.choice(ops)
        if op == "sub" and value < 2:
            op = "add"
        elif op == "add" and value >= _MAX_VALUE - 1:
            op = "sub"
        if op == "add":
            n = rng.randint(1, min(_OPERAND_MAX, _MAX_VALUE - value))
            sentences.append(f"{name} {rng.choice(_ADD)} {n} {item} .")
            new, sym = value + n, "+"
        elif op == "sub":
            n = rng.randint(1, min(_OPERAND_MAX, value - 1))
            sentences.append(f"{name} {rng.choice(_SUB)} {n} {item} .")
            new, sym = value - n, "-"
        else:
            n = rng.randint(2, min(4, _MAX_VALUE // value))
            sentences.append(f"Then the {item} of {name} grow {n} times .")
            new, sym = value * n, "*"
        steps.append(f"{value} {sym} {n} = {new}")
        value = new
    question = " ".join(sentences + [f"How many {item} does {name} have now ?"])
    answer = " . ".join(steps) + f" .\n#### {value}"
    return {"question": question, "answer": answer, "level": level, "final": str(value)}


def generate_split(seed: int, n: int, levels: list[int], stream: str) -> list[dict]:
    """`n` problems with levels cycling through `levels`, from the seed stream named `stream`."""
    rng = random.Random(f"{seed}:{stream}")
    rows = []
    for i in range(n):
        row = generate_problem(rng, levels[i % len(levels)])
        rows.append({"id": f"{stream}-{i}", **row})
    return rows


def _write_jsonl(rows: list[dict], path: Path) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    with open(tmp, "w") as f:
        for row in rows:
            f.write(json.dumps(row, sort_keys=True) + "\n")
    os.replace(tmp, path)


def write_splits(out_dir: str | Path, seed: int, n_pretrain: int, n_rl: int, n_test_per_level: int,
                 levels: list[int]) -> dict[str, int]:
    """Write pretrain.jsonl, rl.jsonl and test.jsonl to `out_dir`; returns the row counts.

    Test questions are removed from the pretraining and RL splits so the held-out numbers measure generalisation.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    test = generate_split(seed, n_test_per_level * len(levels), sorted(levels), "test")
    held_out = {r["question"] for r in test}
    counts = {"test": len(test)}
    for split, n in (("pretrain", n_pretrain), ("rl", n_rl)):
        rows = [r for r in generate_split(seed, n, levels, split) if r["question"] not in held_out]
        _write_jsonl(rows, out / f"{split}.jsonl")
        counts[split] = len(rows)
    _write_jsonl(test, out / "test.jsonl")
    return counts


def vocabulary_words() -> list[str]:
    """Every word the generator can write (the tiny tokenizer's word list, digits excluded)."""
    words = set(NAMES) | set(ITEMS)
    for phrase in _ADD + _SUB:
        words.update(phrase.split())
    words.update("has . How many does have now ? Then the of grow times + - * = ####".split())
    return sorted(words)


def add_arguments(parser) -> None:
    parser.add_argument("--config", required=True, help="YAML config (reads data.tiny)")
    parser.add_argument("--out", required=True, help="output folder for pretrain/rl/test.jsonl")


def run(args) -> int:
    from qerl.config import load_config

    cfg = load_config(args.config)["data"]["tiny"]
    counts = write_splits(args.out, cfg["seed"], cfg["n_pretrain"], cfg["n_rl"], cfg["n_test_per_level"],
                          cfg["levels"])
    print(json.dumps(counts))
    return 0
