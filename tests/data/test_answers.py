"""Answer extractors: \\boxed matching, GSM8K `####`, <answer> tags, number normalization.

Run: `pytest tests/data/test_answers.py -q`
"""
from __future__ import annotations

import pytest

from qerl.data.answers import answer_tag, gsm8k_final_answer, last_boxed, normalize_number


@pytest.mark.parametrize(
    "text, expected",
    [
        (r"so \boxed{42}.", "42"),
        (r"\boxed{\frac{1}{2}}", r"\frac{1}{2}"),
        (r"\boxed{\left\{1,2\right\}}", r"\left\{1,2\right\}"),
        (r"\boxed{{a}{b{c}}}", r"{a}{b{c}}"),
        (r"first \boxed{1} then \boxed{2} finally \boxed{x^{2}}", "x^{2}"),
        (r"\fbox{7}", "7"),
        (r"\boxed{1} and \fbox{2}", "2"),
        (r"\boxed {  3 }", "3"),
        (r"$\boxed 5$", "5"),
        (r"\boxed{1} then \boxed{2", "1"),  # last box unbalanced: fall back to the previous balanced one
        (r"\boxed{2", None),
        (r"\boxedx{2}", None),  # another command
        ("no box here", None),
        ("", None),
        (r"\boxed{}", ""),
    ],
    ids=[
        "simple", "frac", "escaped-braces", "deep-nesting", "several", "fbox", "boxed-then-fbox", "space",
        "short-form", "unbalanced-last", "unbalanced-only", "other-command", "absent", "empty-text", "empty-box",
    ],
)
def test_last_boxed(text, expected):
    assert last_boxed(text) == expected


@pytest.mark.parametrize(
    "noise, expected",
    [
        ("\\boxed{" * 15_000, None),
        ("{" * 100_000, None),
        ("\\boxed{a}" * 11_000 + "{" * 1_000, "a"),
        ("}" * 50_000 + "\\boxed{" + "{" * 50_000, None),
        ("x" * 100_000, None),
        ("\\boxed " * 14_000, "\\boxed"),
    ],
    ids=["open-boxes", "open-braces", "many-boxes-then-open", "close-then-open", "letters", "short-forms"],
)
def test_last_boxed_on_100kb_noise(noise, expected):
    """Adversarial completions (the rollout's 100 kB worst cases) get their answer, not an exception. The matcher is
    one pass over the text, so these take milliseconds; a quadratic one would hang the suite here (no timed
    assertion in a unit test: speed goals live in benchmarks)."""
    assert last_boxed(noise) == expected


def test_last_boxed_many_boxes_result():
    assert last_boxed("\\boxed{a}" * 11_000 + "\\boxed{" + "{" * 1_000) == "a"


@pytest.mark.parametrize(
    "text, expected",
    [
        ("Natalia sold 48/2 = 24 clips.\n#### 72", "72"),
        ("#### 1,000", "1000"),
        ("#### 1,234,567.", "1234567"),
        ("####   -5  ", "-5"),
        ("a #### 1 then #### 2", "2"),
        ("#### 3\nextra line", "3"),
        ("no marker", None),
        ("####   ", None),
        ("#### 0.5", "0.5"),
    ],
    ids=[
        "plain", "thousands", "millions-period", "negative", "last-marker", "first-line", "absent", "empty",
        "decimal",
    ],
)
def test_gsm8k_final_answer(text, expected):
    assert gsm8k_final_answer(text) == expected


@pytest.mark.parametrize(
    "text, expected",
    [
        ("<think>x</think> <answer> 42 </answer>", "42"),
        ("<answer>1</answer> ... <answer>2</answer>", "2"),
        ("<answer>1</answer> <answer>2", "1"),
        ("<answer>unclosed", None),
        ("</answer>", None),
        ("", None),
        ("<answer>\\boxed{5}</answer>", "\\boxed{5}"),
    ],
    ids=["simple", "last", "last-unclosed", "unclosed", "close-only", "empty", "boxed-inside"],
)
def test_answer_tag(text, expected):
    assert answer_tag(text) == expected


@pytest.mark.parametrize(
    "value, expected",
    [
        ("27.0", "27"),
        (27.0, "27"),
        (27, "27"),
        ("$1,000", "1000"),
        ("\\$5.50", "5.5"),
        ("18.", "18"),
        (" 42 ", "42"),
        ("-3", "-3"),
        ("-0.0", "0"),
        ("007", "7"),
        ("0.25", "0.25"),
        (".5", "0.5"),
        ("1 000", "1000"),
        ("\\frac{1}{2}", "\\frac{1}{2}"),
        ("  x + 1 ", "x + 1"),
        ("(1,2)", "(1,2)"),
        ("3, 4", "3, 4"),
    ],
)
def test_normalize_number(value, expected):
    assert normalize_number(value) == expected
