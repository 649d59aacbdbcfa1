"""Synthetic arithmetic word problems for the tiny scale, in GSM8K's format, with difficulty levels 1-5.

Why: the tiny scale must run every method on a CPU in minutes without downloads, yet keep the structure of the
paper's tasks: a word problem, a worked solution ending in `#### N` (GSM8K) and difficulty levels (BigMath's
levels 1-5, which the paper filters to 3-5). Level L takes L arithmetic steps; numbers stay small so a model of
~100k parameters can learn to do them digit by digit.

Each row: {"id", "question", "answer" (worked solution ending "#### N"), "level", "final"}; `final` is N as a string.
The same seed writes byte-identical files. Splits are drawn from disjoint seed streams (pretrain, rl, test), and a
question that appears in the test split is never written to the other two.

The direct-answer habit (why RL has something general to learn at this scale): a fraction `direct_fraction` of
the pretraining rows carries a field "direct" whose value is a guess, the last number of the question, and the base
model is pretrained to answer those rows at once ("<think> </think> <answer> guess </answer>", qerl.models.pretrain).
So the base model, like real base models, sometimes answers without working the problem; the guess is almost always
wrong, and a worked answer is usually right. Outcome-reward RL then has a lever that transfers across problems
(work the problem: the completion grows longer and the reward rises), whereas the other errors of a 100k-parameter
model are arithmetic facts of one problem each, which RL on fresh prompts cannot fix in a few steps (measured and
discussed in docs/TINY_RL.md). The RL and test splits are not touched: rewards and held-out pass@1 grade the true
answer.

Run: `qerl gen-tiny --config config/config.yaml --out results/tiny/data` (qerl/commands/gen_tiny.py)
"""
from __future__ import annotations

import random
from pathlib import Path

from qerl.io import write_jsonl

__all__ = ["NAMES", "ITEMS", "OPERAND_MAX", "generate_problem", "generate_split", "direct_guess", "add_direct_answers",
           "write_splits", "vocabulary_words"]

NAMES = ["Ann", "Ben", "Cara", "Dan", "Eva", "Finn", "Gus", "Hana", "Ivy", "Jon", "Kim", "Leo", "Mia", "Ned", "Oli", "Pia"]
ITEMS = ["apples", "pens", "books", "coins", "cards", "eggs", "shells", "stamps", "cups", "rocks", "kites", "toys"]
_ADD = ["buys", "finds", "gets", "wins"]
_SUB = ["gives away", "loses", "eats", "sells"]
_MAX_VALUE = 99  # every intermediate result stays in [0, 99]
OPERAND_MAX = 9  # default largest operand of + and - (config data.tiny.operand_max)


def generate_problem(rng: random.Random, level: int, operand_max: int = OPERAND_MAX) -> dict:
    """One problem of `level` steps.

    Args:
        rng: the random stream (the caller seeds it).
        level: number of arithmetic steps, 1-5.
        operand_max: largest operand of + and - (and of the starting value); x2-x4 multiplications keep values <= 99.

    Returns:
        {"question", "answer", "level", "final"} in GSM8K's format.

    Raises:
        ValueError: if `level` is outside 1-5 or operand_max outside 2-99.
    """
    if not 1 <= level <= 5:
        raise ValueError(f"level must be in 1-5, got {level!r}")
    if not 2 <= operand_max <= _MAX_VALUE:
        raise ValueError(f"data.tiny.operand_max must be in 2-{_MAX_VALUE}, got {operand_max!r}")
    name, item = rng.choice(NAMES), rng.choice(ITEMS)
    value = rng.randint(1, operand_max)
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
            n = rng.randint(1, min(operand_max, _MAX_VALUE - value))
            sentences.append(f"{name} {rng.choice(_ADD)} {n} {item} .")
            new, sym = value + n, "+"
        elif op == "sub":
            n = rng.randint(1, min(operand_max, value - 1))
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


def generate_split(seed: int, n: int, levels: list[int], stream: str, operand_max: int = OPERAND_MAX) -> list[dict]:
    """`n` problems with levels cycling through `levels`, from the seed stream named `stream`."""
    rng = random.Random(f"{seed}:{stream}")
    rows = []
    for i in range(n):
        row = generate_problem(rng, levels[i % len(levels)], operand_max)
        rows.append({"id": f"{stream}-{i}", **row})
    return rows


def direct_guess(question: str) -> str:
    """The direct answer of the habit: the last number of the question (a surface guess, right only by chance)."""
    numbers = [w for w in question.split() if w.isdigit()]
    return numbers[-1]


def add_direct_answers(rows: list[dict], fraction: float, seed: int) -> int:
    """Mark a seeded `fraction` of `rows` (in place) with "direct": the guess they are pretrained to answer at once.

    Returns:
        How many rows were marked.

    Raises:
        ValueError: if fraction is outside [0, 1).
    """
    if not 0.0 <= fraction < 1.0:
        raise ValueError(f"data.tiny.direct_fraction must be in [0, 1), got {fraction!r}")
    rng = random.Random(f"{seed}:direct")
    marked = 0
    for row in rows:
        if rng.random() < fraction:
            row["direct"] = direct_guess(row["question"])
            marked += 1
    return marked


def write_splits(out_dir: str | Path, seed: int, n_pretrain: int, n_rl: int, n_test_per_level: int,
                 levels: list[int], operand_max: int = OPERAND_MAX, direct_fraction: float = 0.0) -> dict[str, int]:
    """Write pretrain.jsonl, rl.jsonl and test.jsonl to `out_dir`; returns the row counts (and "direct": the
    pretraining rows marked with the direct-answer habit).

    Test questions are removed from the pretraining and RL splits so the held-out numbers measure generalisation.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    test = generate_split(seed, n_test_per_level * len(levels), sorted(levels), "test", operand_max)
    held_out = {r["question"] for r in test}
    counts = {"test": len(test)}
    for split, n in (("pretrain", n_pretrain), ("rl", n_rl)):
        rows = [r for r in generate_split(seed, n, levels, split, operand_max) if r["question"] not in held_out]
        if split == "pretrain":
            counts["direct"] = add_direct_answers(rows, direct_fraction, seed)
        write_jsonl(out / f"{split}.jsonl", rows, sort_keys=True)
        counts[split] = len(rows)
    write_jsonl(out / "test.jsonl", test, sort_keys=True)
    return counts


def vocabulary_words() -> list[str]:
    """Every word the generator can write (the tiny tokenizer's word list, digits excluded)."""
    words = set(NAMES) | set(ITEMS)
    for phrase in _ADD + _SUB:
        words.update(phrase.split())
    words.update("has . How many does have now ? Then the of grow times + - * = ####".split())
    return sorted(words)
