"""Pure-string answer extraction: the last \\boxed{...}, GSM8K's `#### N`, the <answer> tag, plain numbers.

Why: the benchmark loaders (reference answers), the reward functions (model answers) and the evaluator all need the
same small set of extractors; keeping them here, free of heavy imports, means every stage agrees on what "the
answer" of a text is. Equivalence checking (math-verify) happens elsewhere; these helpers only *locate* and lightly
*normalize* answers.

Every function is linear in the length of its input (no backtracking regexes), so a 100 kB degenerate model
completion costs microseconds, not minutes.

Run the tests: `pytest tests/data/test_answers.py -q`.
"""
from __future__ import annotations

import re

__all__ = ["last_boxed", "gsm8k_final_answer", "answer_tag", "normalize_number"]


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` (or ``\\fbox{...}``) in `text`, matching nested braces.

    A box whose braces never close is skipped in favour of the previous balanced one. ``\\boxed 5`` (the TeX
    short form with a single token, no braces) yields ``"5"``. One pass over the braces pairs every ``{`` with its
    ``}``, so the cost is linear even for 100 kB of ``\\boxed{\\boxed{...`` noise.

    Args:
        text: any string, e.g. a model completion or a MATH solution.

    Returns:
        The stripped box content, or None if there is no balanced box.
    """
    if not text:
        return None
    starts = _box_starts(text)
    if not starts:
        return None
    n = len(text)
    closing: dict[int, int] | None = None  # '{' offset -> matching '}' offset, built lazily
    for start in reversed(starts):
        i = start
        while i < n and text[i] == " ":
            i += 1
        if i >= n:
            continue
        if text[i] != "{":
            # \boxed 5 (short form): the next token, up to whitespace, '$' or '}'.
            j = i
            while j < n and not text[j].isspace() and text[j] not in "${}":
                j += 1
            if j > i:
                return text[i:j]
            continue
        if closing is None:
            closing = _match_braces(text, starts[0])
        close = closing.get(i)
        if close is not None:
            return text[i + 1 : close].strip()
    return None


def _box_starts(text: str) -> list[int]:
    """Offsets just past every \\boxed / \\fbox command name, in increasing order."""
    starts = []
    for m in _BOX.finditer(text):
        end = m.end()
        # `\boxedx` would be another command; `\boxed{` and `\boxed {` are both boxes.
        if end >= len(text) or not text[end].isalpha():
            starts.append(end)
    return starts


def _match_braces(text: str, begin: int) -> dict[int, int]:
    """Map each '{' at or after `begin` to its matching '}' (unclosed ones are absent). One linear pass."""
    stack: list[int] = []
    closing: dict[int, int] = {}
    for m in _BRACE.finditer(text, begin):
        if m.group() == "{":
            stack.append(m.start())
        elif stack:
            closing[stack.pop()] = m.start()
    return closing


_BOX = re.compile(r"\\(?:boxed|fbox)")
_BRACE = re.compile(r"[{}]")


def gsm8k_final_answer(text: str) -> str | None:
    """The final answer of a GSM8K-style solution: the text after the last ``####``.

    Thousands separators are removed (``"1,000"`` -> ``"1000"``), as is a trailing period.

    Args:
        text: a GSM8K ``answer`` field or a model completion in that format.

    Returns:
        The stripped answer, or None if there is no ``####`` or nothing follows it.
    """
    if not text:
        return None
    pos = text.rfind("####")
    if pos == -1:
        return None
    tail = text[pos + 4 :].strip()
    # Only the first line after the marker is the answer.
    tail = tail.split("\n", 1)[0].strip()
    tail = _strip_thousands(tail).rstrip(".").strip()
    return tail or None


_THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}(?!\d))")


def _strip_thousands(s: str) -> str:
    """Remove commas that separate digit groups of three ("1,234,567" -> "1234567"); other commas stay."""
    return _THOUSANDS.sub("", s)


def answer_tag(text: str) -> str | None:
    """Content of the last closed ``<answer>...</answer>`` pair in `text`.

    Args:
        text: a model completion in the paper's ``<think>...</think> <answer>...</answer>`` format.

    Returns:
        The stripped content, or None if there is no closed pair.
    """
    if not text:
        return None
    close = text.rfind("</answer>")
    if close == -1:
        return None
    open_ = text.rfind("<answer>", 0, close)
    if open_ == -1:
        return None
    return text[open_ + len("<answer>") : close].strip()


_NUMBER = re.compile(r"[-+]?(\d+(\.\d*)?|\.\d+)([eE][-+]?\d+)?")


def normalize_number(s: object) -> str:
    """Canonical text of a plain numeric answer; non-numeric strings come back stripped but otherwise unchanged.

    Removes ``$`` and ``\\$``, spaces, thousands commas and a trailing period; drops a zero fractional part
    (``"27.0"`` -> ``"27"``, ``"3.50"`` -> ``"3.5"``); keeps the sign (``"-4"``). Ints and floats are accepted too
    (``27.0`` -> ``"27"``).

    Args:
        s: the answer (str, int or float).

    Returns:
        The normalized string.
    """
    if isinstance(s, bool):
        return str(s)
    if isinstance(s, int):
        return str(s)
    if isinstance(s, float):
        s = repr(s)
    text = str(s).strip()
    candidate = text.replace("\\$", "").replace("$", "").replace(" ", "")
    candidate = _strip_thousands(candidate)
    if candidate.endswith("."):
        candidate = candidate[:-1]
    if not candidate or _NUMBER.fullmatch(candidate) is None:
        return text
    sign = ""
    if candidate[0] in "+-":
        sign, candidate = ("-" if candidate[0] == "-" else ""), candidate[1:]
    if "e" in candidate.lower():
        try:
            value = float(candidate)
        except ValueError:  # pragma: no cover - the regex admits only valid floats
            return text
        if value.is_integer() and abs(value) < 1e16:
            candidate = str(int(value))
        else:
            candidate = repr(value)
    if "." in candidate:
        whole, frac = candidate.split(".", 1)
        frac = frac.rstrip("0")
        whole = whole.lstrip("0") or "0"
        candidate = f"{whole}.{frac}" if frac else whole
    else:
        candidate = candidate.lstrip("0") or "0"
    if candidate == "0":
        sign = ""
    return sign + candidate
