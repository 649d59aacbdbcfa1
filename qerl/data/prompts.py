"""Prompt templates: the paper's <think>/<answer> instruction, wrapped in the model's own chat template.

Why: QeRL (App. E) trains and evaluates with one user turn made of the problem followed by a fixed instruction that
asks for ``<think> ... </think> <answer> ... </answer>``; the format reward and the answer extractor
(`qerl.data.answers.answer_tag`) rely on it. Keeping the string here, once, means training, rollout and evaluation
all build byte-identical prompts.

Deviation: the paper does not say whether the instruction follows the question on the same line or a new one; we
put it on a new line (``question + "\\n" + instruction``).

Usage::

    from qerl.data.prompts import build_prompt
    text = build_prompt(problem.question, tokenizer)            # chat-formatted, ends with the assistant header

Run the tests: ``pytest tests/data/test_prompts.py -q``.
"""
from __future__ import annotations

from typing import Any

__all__ = ["PAPER_INSTRUCTION", "INSTRUCTIONS", "user_message", "build_prompt"]

#: The paper's prompt suffix (App. E), verbatim.
PAPER_INSTRUCTION = (
    "Solve the following math problem step by step. The reasoning process and direct answer are enclosed within "
    "<think> </think> and <answer> </answer> tags, respectively, i.e., <think> reasoning process here </think> "
    "<answer> answer here </answer>"
)

#: config value of ``prompt.instruction`` -> instruction text ("" = the bare question).
INSTRUCTIONS: dict[str, str] = {"paper": PAPER_INSTRUCTION, "none": ""}


def user_message(question: str, instruction: str = "paper") -> str:
    """The user turn: the question, then a newline and the instruction (nothing added for ``"none"``).

    Args:
        question: the problem statement.
        instruction: ``"paper"`` (the App. E suffix) or ``"none"``.

    Returns:
        The message text.

    Raises:
        ValueError: for an unknown instruction name or a question that is not a non-empty string.
    """
    if instruction not in INSTRUCTIONS:
        raise ValueError(f"prompt.instruction: unknown value {instruction!r}; known: {sorted(INSTRUCTIONS)}")
    if not isinstance(question, str) or not question.strip():
        raise ValueError(f"question must be a non-empty string, got {question!r}")
    suffix = INSTRUCTIONS[instruction]
    return f"{question}\n{suffix}" if suffix else question


def build_prompt(question: str, tokenizer: Any, instruction: str = "paper") -> str:
    """The full prompt text: one user turn through the tokenizer's chat template, with the generation prompt.

    Args:
        question: the problem statement.
        tokenizer: a transformers tokenizer with a ``chat_template``.
        instruction: ``"paper"`` or ``"none"`` (see `user_message`).

    Returns:
        The rendered prompt string (not tokenized), ending where the assistant's reply begins.

    Raises:
        ValueError: if the tokenizer has no chat template, or for a bad instruction or question.
    """
    content = user_message(question, instruction)
    if not getattr(tokenizer, "chat_template", None):
        name = getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__
        raise ValueError(
            f"tokenizer {name!r} has no chat template (tokenizer.chat_template is empty); use an instruct model's "
            "tokenizer or set tokenizer.chat_template to a Jinja template"
        )
    return tokenizer.apply_chat_template(
        [{"role": "user", "content": content}], tokenize=False, add_generation_prompt=True
    )
