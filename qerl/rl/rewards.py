"""Rule-based rewards for math RL: answer extraction, math-verify equivalence, and a format reward.

Why: GRPO/DAPO in QeRL (sec. 3, App. E) score each sampled completion by whether its final answer equals the
reference. The same grading is used by the evaluator (`qerl.evaluate`) and the `qerl grade-check` self-test, so the
training reward and the reported pass@1 agree on what "correct" means.

How: `extract_answer` takes the last closed ``<answer>...</answer>`` (and, inside it, the last ``\\boxed{}`` if there
is one), else the last ``\\boxed{}`` of the text, else GSM8K's ``#### N``; the locating helpers live in
`qerl.data.answers`. `is_correct` first compares plain numbers exactly (``"$1,000." == "1000"``,
``"18 dollars" == "18"``, no sympy), then falls back to math-verify (`math_verify.parse` / `verify` on the answer
wrapped in ``\\boxed{}`` and the gold wrapped in ``$...$``: LaTeX and numeric equivalence, ``\\dfrac12 == 0.5``).
Run the tests: `pytest tests/rl/test_rewards.py -q`.

Robustness (a reward never crashes or hangs on model output):
- answers longer than `MAX_ANSWER_CHARS` (1000) are graded incorrect without parsing;
- power towers (``10^{10^{10}}``, ``2**3**4``) and factorials of big integers are graded incorrect without parsing,
  because sympy would try to evaluate them; everything else runs under math-verify's own SIGALRM timeouts
  (`timeout_s`, whole seconds), which interrupt sympy in the main thread;
- math-verify's timeouts only work in the main thread; called from another thread we pass no timeout and rely on the
  two guards above (documented limitation);
- lone surrogates and other non-UTF-8 junk are replaced before grading; bytes are decoded with replacement.

Choices the paper does not specify (deviations, documented):
- The format reward is strict: the completion (stripped) must be exactly ``<think> ... </think> <answer> ... </answer>``
  with each tag once, so it cannot be gamed by repeating answer tags.
- `compute_rewards` uses reward = correct + format_weight * formatted, with format_weight 0 by default (the paper
  plots the accuracy reward only).
- Two plain numbers are compared exactly (as fractions), not with math-verify's 6-decimal float rounding.
- Several ``<answer>`` tags or boxes: the last one counts.
"""
from __future__ import annotations

import re
import threading
from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache
from typing import Sequence

from qerl.data.answers import answer_tag, gsm8k_final_answer, last_boxed, normalize_number

__all__ = [
    "MAX_ANSWER_CHARS",
    "RewardResult",
    "extract_answer",
    "is_correct",
    "accuracy_reward",
    "format_reward",
    "compute_rewards",
    "coin_draws",
    "coin_rewards",
]

MAX_ANSWER_CHARS = 1000
DEFAULT_TIMEOUT_S = 3

_PLAIN_NUMBER = re.compile(r"-?\d+(\.\d+)?")
# Patterns sympy would try to evaluate into astronomically large integers.
_EXPLOSIVE = [
    re.compile(r"\^\s*\{\s*\(?\s*\d+\s*(\^|\*\*|!)"),  # 10^{10^{10}}, 10^{(10^10)}, 2^{99!}
    re.compile(r"\^\s*\(?\s*\d+\s*(\^|\*\*)"),  # 10^10^10, 10^(10^10)
    re.compile(r"\*\*\s*\(?\s*\d+\s*(\^|\*\*)"),  # 10**10**10, 10**(10**10)
    re.compile(r"\d{6,}\s*!|\([^()]*[\^*][^()]*\)\s*!"),  # 100000000!, (10^{10})!
    re.compile(r"(\^|\*\*)\s*[{(]?\s*\d{7,}"),  # 10^{10000000}, 10**10000000
]


@dataclass(frozen=True)
class RewardResult:
    """The grading of one completion.

    Attributes:
        reward: correct + format_weight * formatted.
        correct: the extracted answer is equivalent to the gold answer.
        formatted: the completion follows the <think>/<answer> format.
        extracted: the extracted answer (None if none was found).
    """

    reward: float
    correct: bool
    formatted: bool
    extracted: str | None


def _clean(text: object) -> str:
    """Model output as a valid str: None -> "", bytes decoded, lone surrogates replaced."""
    if text is None:
        return ""
    if isinstance(text, (bytes, bytearray)):
        return bytes(text).decode("utf-8", errors="replace")
    if not isinstance(text, str):
        raise ValueError(f"completion must be str, bytes or None, got {type(text).__name__}")
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return text.encode("utf-8", errors="replace").decode("utf-8")


def extract_answer(text: str | bytes | None) -> str | None:
    """The final answer of a completion.

    Order: the last closed ``<answer>...</answer>`` (the last ``\\boxed{}`` inside it if it has one), else the last
    balanced ``\\boxed{}`` of the text, else the text after GSM8K's last ``####``. Empty candidates are skipped.

    Args:
        text: a model completion (None and bytes are accepted; bytes are decoded with replacement).

    Returns:
        The stripped answer, or None if the completion has none.

    Raises:
        ValueError: if `text` is not str, bytes or None.
    """
    text = _clean(text)
    if not text:
        return None
    tagged = answer_tag(text)
    if tagged:
        boxed = last_boxed(tagged)
        return boxed if boxed else tagged
    for extractor in (last_boxed, gsm8k_final_answer):
        found = extractor(text)
        if found:
            return found
    return None


def _as_plain_number(s: str) -> Fraction | None:
    """`s` as an exact number if it is a plain decimal (after `normalize_number`), else None."""
    norm = normalize_number(s)
    if len(norm) > MAX_ANSWER_CHARS or _PLAIN_NUMBER.fullmatch(norm) is None:
        return None
    return Fraction(norm)


_UNIT_ANSWER = re.compile(r"(?:\\?\$)?\s*(-?\d[\d,]*(?:\.\d+)?)\s+([A-Za-z][A-Za-z ./-]*?)\s*\.?")
_MATH_WORDS = {"pi", "sqrt", "ln", "log", "sin", "cos", "tan", "cot", "sec", "csc", "exp", "and", "or", "i", "e"}


def _strip_units(s: str) -> str:
    """``"18 dollars"`` / ``"$5 per hour"`` -> the number; anything else unchanged.

    Only a plain number followed by whitespace and words of two or more letters that are not math names counts as
    number + unit, so ``"2 x"``, ``"2x"`` or ``"3 pi"`` keep their meaning.
    """
    m = _UNIT_ANSWER.fullmatch(s)
    if m is None:
        return s
    words = [w for w in re.split(r"[ ./-]+", m.group(2)) if w]
    if not words or any(len(w) < 2 or w.lower() in _MATH_WORDS for w in words):
        return s
    return m.group(1)


def _is_explosive(s: str) -> bool:
    return any(p.search(s) for p in _EXPLOSIVE)


def _timeout(timeout_s: int | None) -> int | None:
    """math-verify's timeouts use SIGALRM, which only the main thread may set; elsewhere run without one."""
    if timeout_s is None or threading.current_thread() is not threading.main_thread():
        return None
    return max(1, int(timeout_s))


@lru_cache(maxsize=4096)
def _parse_gold(gold: str, timeout_s: int | None) -> tuple:
    from math_verify import parse

    parsed = parse(f"${gold}$", parsing_timeout=timeout_s)
    if not parsed:  # text answers that are not valid inside $...$ (rare): let math-verify find what it can
        parsed = parse(gold, parsing_timeout=timeout_s)
    if not parsed:
        parsed = [gold.strip()]  # string comparison as the last resort
    return tuple(parsed)


def is_correct(pred: str | None, gold: str | int | float, timeout_s: int | None = DEFAULT_TIMEOUT_S) -> bool:
    """Whether the extracted answer `pred` is equivalent to the reference `gold`.

    Plain numbers are compared exactly after normalization (``"$1,000."`` == ``"1000"``, ``"27.0"`` == ``27``);
    a number followed by unit words counts as the number (``"18 dollars"`` == ``"18"``, but ``"2 x"`` != ``"2"``);
    anything else goes through math-verify, parsing the answer as LaTeX (wrapped in ``\\boxed{}``). The answer is
    never searched for "some number in it" (math-verify's free-text mode would grade ``"2x"`` or ``"1,-2"`` equal
    to ``"2"`` and ``"1"``).

    Args:
        pred: the model's extracted answer (None or empty: incorrect).
        gold: the reference answer (a string in LaTeX or plain text, or a number).
        timeout_s: math-verify's parse and compare timeout in whole seconds (main thread only); None disables it.

    Returns:
        True if equivalent; False otherwise, including on unparseable, oversized or explosive answers.

    Raises:
        ValueError: if `gold` is empty or not a str/int/float.
    """
    if isinstance(gold, bool) or not isinstance(gold, (str, int, float)):
        raise ValueError(f"gold answer must be str, int or float, got {type(gold).__name__}: {gold!r}")
    gold_s = normalize_number(gold) if not isinstance(gold, str) else gold.strip()
    if not gold_s:
        raise ValueError("gold answer is empty")
    if pred is None:
        return False
    pred = _clean(pred).strip()
    if not pred or len(pred) > MAX_ANSWER_CHARS:
        return False
    gold_num = _as_plain_number(gold_s)
    pred_num = _as_plain_number(_strip_units(pred))
    if gold_num is not None and pred_num is not None:
        return gold_num == pred_num
    if _is_explosive(pred):
        return False
    return _math_verify(pred, gold_s, _timeout(timeout_s))


def _math_verify(pred: str, gold: str, timeout_s: int | None) -> bool:
    from math_verify import LatexExtractionConfig, parse, verify

    try:
        gold_parsed = list(_parse_gold(gold, timeout_s))
        # LaTeX extraction only: the default also runs an expression extractor that finds "some number" inside junk
        # ("Oli has## 3 loses" would parse as 3)
        parsed = parse(f"\\boxed{{{pred}}}", extraction_config=[LatexExtractionConfig()], parsing_timeout=timeout_s)
        return bool(parsed) and verify(gold_parsed, parsed, timeout_seconds=timeout_s)
    except Exception:  # math-verify catches its own errors; this is the last line of defence for model junk
        return False


def accuracy_reward(completion: str | bytes | None, gold: str | int | float, timeout_s: int | None = DEFAULT_TIMEOUT_S
                    ) -> float:
    """1.0 if the completion's extracted answer is equivalent to `gold`, else 0.0.

    Args:
        completion: the model's text.
        gold: the reference answer.
        timeout_s: see `is_correct`.

    Returns:
        1.0 or 0.0.

    Raises:
        ValueError: on a bad `gold` or a completion that is not str/bytes/None.
    """
    return float(is_correct(extract_answer(completion), gold, timeout_s=timeout_s))


_TAGS = ("<think>", "</think>", "<answer>", "</answer>")


def format_reward(completion: str | bytes | None) -> float:
    """1.0 if the completion is exactly ``<think> ... </think> <answer> ... </answer>`` (whitespace around and
    between the two blocks allowed, each tag exactly once, nothing before or after), else 0.0.

    Implemented with `str.find`/`count`, so it is linear in the length of the text (no regex backtracking).

    Args:
        completion: the model's text.

    Returns:
        1.0 or 0.0.

    Raises:
        ValueError: if `completion` is not str, bytes or None.
    """
    text = _clean(completion).strip()
    if not (text.startswith("<think>") and text.endswith("</answer>")):
        return 0.0
    if any(text.count(tag) != 1 for tag in _TAGS):
        return 0.0
    think_end = text.find("</think>")
    answer_start = text.find("<answer>")
    if not (0 < think_end < answer_start) or text[think_end + len("</think>") : answer_start].strip():
        return 0.0
    return 1.0


def compute_rewards(
    completions: Sequence[str | bytes | None],
    golds: Sequence[str | int | float],
    format_weight: float = 0.0,
    timeout_s: int | None = DEFAULT_TIMEOUT_S,
) -> list[RewardResult]:
    """Grade a batch of completions (e.g. the B*G rollouts of a GRPO step; repeat each gold G times).

    Args:
        completions: model texts.
        golds: reference answers, one per completion.
        format_weight: weight of the format reward added to the 0/1 accuracy reward.
        timeout_s: see `is_correct`.

    Returns:
        One `RewardResult` per completion, in order.

    Raises:
        ValueError: if the lengths differ, a gold answer is bad, or a completion is not str/bytes/None.
    """
    if len(completions) != len(golds):
        raise ValueError(f"compute_rewards: {len(completions)} completions but {len(golds)} gold answers")
    results = []
    for completion, gold in zip(completions, golds):
        extracted = extract_answer(completion)
        correct = is_correct(extracted, gold, timeout_s=timeout_s)
        formatted = format_reward(completion) == 1.0
        results.append(RewardResult(float(correct) + format_weight * float(formatted), correct, formatted, extracted))
    return results


def coin_draws(seed: int, n: int) -> list[bool]:
    """n fair-coin draws from a CPU generator seeded with `seed` (the same list for the same seed everywhere)."""
    import torch  # here, not at the top: grading alone does not need torch

    gen = torch.Generator().manual_seed(seed)
    return (torch.rand(n, generator=gen) < 0.5).tolist()


def coin_rewards(seed: int, step: int, rank: int = 0):
    """The reward function of `train.tasks.<t>.reward: coin` for one step: 0/1 rewards by a fair coin per completion,
    ignoring the texts and golds, drawn from (seed, step, rank) alone, so a resumed run draws the same ones. Timing
    runs on random weights use it so that advantages are non-zero and every update runs its backward; nothing is
    graded (`correct` and `formatted` are False)."""
    def reward_fn(completions, golds, format_weight: float = 0.0) -> list[RewardResult]:
        if len(completions) != len(golds):
            raise ValueError(f"coin_rewards: {len(completions)} completions but {len(golds)} gold answers")
        draws = coin_draws((seed * 1_000_003 + step) * 101 + rank, len(completions))
        return [RewardResult(float(d), False, False, None) for d in draws]
    return reward_fn
