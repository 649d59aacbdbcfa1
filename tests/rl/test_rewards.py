"""Rewards: answer extraction, math-verify equivalence, format reward, adversarial completions.

Run: `pytest tests/rl/test_rewards.py -q`
"""
from __future__ import annotations

import time

import pytest

pytest.importorskip("math_verify")

from qerl.rl.rewards import (  # noqa: E402
    MAX_ANSWER_CHARS,
    RewardResult,
    accuracy_reward,
    compute_rewards,
    extract_answer,
    format_reward,
    is_correct,
)

GOOD = "<think>2 + 3 = 5</think> <answer>5</answer>"


@pytest.mark.parametrize(
    "text, expected",
    [
        (GOOD, "5"),
        ("<think>x</think><answer>so \\boxed{7}.</answer>", "7"),  # a box inside the tag wins
        ("<answer>1</answer> no wait <answer>2</answer>", "2"),  # the last tag counts
        ("\\boxed{1} ... \\boxed{\\frac{3}{4}}", "\\frac{3}{4}"),  # the last box counts
        ("Janet makes 9 * 2 = 18.\n#### 18", "18"),
        ("#### 1,000.", "1000"),
        ("<answer></answer> \\boxed{4}", "4"),  # an empty tag falls back to the box
        ("<answer>3", None),  # unclosed tag, nothing else
        ("\\boxed{1} then \\boxed{2", "1"),  # unbalanced last box: the previous balanced one
        ("", None),
        (None, None),
        ("just words, no answer", None),
    ],
    ids=["tag", "box-in-tag", "last-tag", "last-box", "gsm8k", "gsm8k-comma", "empty-tag", "unclosed-tag",
         "unbalanced-box", "empty", "none", "no-answer"],
)
def test_extract_answer(text, expected):
    assert extract_answer(text) == expected


@pytest.mark.parametrize(
    "pred, gold",
    [
        ("$1,000.", "1000"),
        ("1,000", "1000"),
        ("1000.", "1000"),
        ("\\$18", "18"),
        ("$18.00", "18"),
        ("18 dollars", "18"),
        ("18 eggs", "18"),
        ("$5 per hour.", "5"),
        ("18 \\text{ dollars}", "18"),
        ("27", "27.0"),
        ("27", 27.0),
        ("-4", "-4"),
        ("\\frac{1}{2}", "\\frac{1}{2}"),
        ("0.5", "\\frac{1}{2}"),
        ("\\dfrac12", "\\frac{1}{2}"),
        ("1/2", "\\frac{1}{2}"),
        ("\\tfrac{1}{2}", "\\frac{1}{2}"),
        ("(3, \\frac{\\pi}{2})", "\\left( 3, \\frac{\\pi}{2} \\right)"),
        ("\\text{(C)}", "\\text{(C)}"),
        ("2\\sqrt{2}", "\\sqrt{8}"),
    ],
    ids=lambda v: str(v),
)
def test_equivalent(pred, gold):
    assert is_correct(pred, gold)


@pytest.mark.parametrize(
    "pred, gold",
    [("1001", "1000"), ("0.51", "\\frac{1}{2}"), ("\\frac{1}{3}", "\\frac{1}{2}"), ("-18", "18"), ("", "18"),
     (None, "18"), ("18", "\\frac{1}{2}"),
     # found by `qerl grade-check` (shuffled answers): a free-text search would pick a number out of these
     ("1,-2", "1"), ("2^{2005}", "2"), ("\\left( \\frac{15}{4}, \\frac{1}{2}, 0 \\right)", "0"), ("2x", "2"),
     ("2 x", "2"), ("3 pi", "3"), ("18 dollars and 5 cents", "5")],
    ids=lambda v: str(v),
)
def test_not_equivalent(pred, gold):
    assert not is_correct(pred, gold)


@pytest.mark.parametrize(
    "text, expected",
    [
        (GOOD, 1.0),
        ("<think>\nabc\n</think>\n\n<answer>\n5\n</answer>\n", 1.0),
        ("<answer>5</answer>", 0.0),
        ("<think>a</think>", 0.0),
        ("<think>a</think> junk <answer>5</answer>", 0.0),
        ("<think>a</think> <answer>5</answer> trailing", 0.0),
        ("<think>a</think> <answer>1</answer><answer>5</answer>", 0.0),
        ("<answer>5</answer> <think>a</think>", 0.0),
        ("", 0.0),
    ],
    ids=["ok", "ok-newlines", "no-think", "no-answer", "junk-between", "trailing", "two-answers", "swapped", "empty"],
)
def test_format_reward(text, expected):
    assert format_reward(text) == expected


def _graded_quickly(completion, gold="5", limit_s=2.5):
    start = time.perf_counter()
    result = compute_rewards([completion], [gold], format_weight=0.5, timeout_s=1)[0]
    assert time.perf_counter() - start < limit_s
    assert isinstance(result, RewardResult)
    return result


@pytest.mark.parametrize(
    "completion",
    [
        "<answer>" + "1" + "0" * 100000 + "</answer>",  # 10**100000 written out (over the length cap)
        "<answer>10**100000</answer>",
        "<answer>10^{100000}</answer>",
        "<answer>10^{10^{10}}</answer>",
        "<answer>9^{9^{9^{9}}}</answer>",
        "<answer>10**10**10</answer>",
        "<answer>100000000!</answer>",
        "<answer>(10^{10})!</answer>",
        "\\boxed{" + "x" * (MAX_ANSWER_CHARS + 1) + "}",
    ],
    ids=["digits-100k", "pow-python", "pow-latex", "tower", "tower4", "tower-python", "factorial", "factorial-pow",
         "over-cap"],
)
def test_huge_answers_graded_wrong_fast(completion):
    r = _graded_quickly(completion)
    assert not r.correct and r.reward in (0.0, 0.5)


def test_slow_sympy_is_cut_by_the_timeout():
    """Not caught by the explosive-pattern guard: math-verify's own (SIGALRM) timeout ends it, graded wrong."""
    r = _graded_quickly("<answer>\\binom{10^{6}}{5 \\cdot 10^{5}}</answer>", limit_s=4.5)
    assert not r.correct


@pytest.mark.parametrize(
    "completion",
    [
        "".join(chr(33 + (i * 7919) % 90) for i in range(100_000)),  # 100 kB of printable noise
        "{" * 50_000 + "\\boxed{" + "}" * 10,  # unbalanced braces
        "\\boxed{" * 20_000,
        "<think>" * 10_000 + "</answer>" * 10_000,
        "<answer>\\frac{1}{</answer>",
        "<answer>}}}{{{</answer>",
        "",
        "\udcff\ud800 \x00\x01\x7f\ufffd <answer>\udcff5</answer>",  # lone surrogates and control characters
        b"\xff\xfe<answer>5\xc3</answer>",  # bytes that are not valid UTF-8
        None,
    ],
    ids=["noise-100kB", "unbalanced-open", "boxed-spam", "tag-spam", "broken-frac", "braces", "empty", "surrogates",
         "bad-bytes", "none"],
)
def test_adversarial_never_crashes(completion):
    r = _graded_quickly(completion)
    assert r.reward in (0.0, 0.5, 1.0, 1.5)


def test_several_answers_last_counts():
    assert accuracy_reward("<answer>5</answer> hmm, actually <answer>6</answer>", "6") == 1.0
    assert accuracy_reward("<answer>6</answer> hmm, actually <answer>5</answer>", "6") == 0.0
    assert accuracy_reward("\\boxed{6} or maybe \\boxed{5}", "6") == 0.0


def test_compute_rewards_combines_format_and_accuracy():
    completions = [GOOD, "<answer>5</answer>", "<think>a</think> <answer>4</answer>", "\\boxed{5}"]
    results = compute_rewards(completions, ["5"] * 4, format_weight=0.5)
    assert [r.reward for r in results] == [1.5, 1.0, 0.5, 1.0]
    assert [r.correct for r in results] == [True, True, False, True]
    assert [r.formatted for r in results] == [True, False, True, False]
    assert [r.extracted for r in results] == ["5", "5", "4", "5"]
    assert [r.reward for r in compute_rewards(completions, ["5"] * 4)] == [1.0, 1.0, 0.0, 1.0]


def test_bad_inputs_raise_value_error():
    with pytest.raises(ValueError, match="2 completions but 1"):
        compute_rewards(["a", "b"], ["1"])
    with pytest.raises(ValueError, match="gold answer is empty"):
        is_correct("1", "  ")
    with pytest.raises(ValueError, match="gold answer must be"):
        is_correct("1", None)
    with pytest.raises(ValueError, match="completion must be"):
        extract_answer(12)


def test_works_outside_the_main_thread():
    """math-verify's SIGALRM timeout is main-thread only; the reward must still grade in a worker thread."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(1) as pool:
        results = list(pool.map(lambda c: accuracy_reward(c, "\\frac{1}{2}"), ["<answer>0.5</answer>", "\\boxed{3}"]))
    assert results == [1.0, 0.0]
