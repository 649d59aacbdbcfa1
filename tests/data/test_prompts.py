"""Prompts: the paper's instruction verbatim, the user message, and chat-template rendering (with and without one).

The tokenizer is built in code (a word-level `tokenizers` model wrapped in PreTrainedTokenizerFast), so nothing is
downloaded.

Run: `pytest tests/data/test_prompts.py -q`
"""
from __future__ import annotations

import pytest

from qerl.data.answers import answer_tag
from qerl.data.prompts import PAPER_INSTRUCTION, build_prompt, user_message

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def _tokenizer(chat_template: str | None):
    tokenizers = pytest.importorskip("tokenizers")
    transformers = pytest.importorskip("transformers")
    vocab = {"<unk>": 0, "<|im_start|>": 1, "<|im_end|>": 2, "what": 3, "is": 4}
    backend = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tok = transformers.PreTrainedTokenizerFast(
        tokenizer_object=backend, unk_token="<unk>", bos_token="<|im_start|>", eos_token="<|im_end|>"
    )
    if chat_template is not None:
        tok.chat_template = chat_template
    return tok


def test_paper_instruction_is_verbatim():
    assert PAPER_INSTRUCTION == (
        "Solve the following math problem step by step. The reasoning process and direct answer are enclosed "
        "within <think> </think> and <answer> </answer> tags, respectively, i.e., <think> reasoning process here "
        "</think> <answer> answer here </answer>"
    )
    assert answer_tag(PAPER_INSTRUCTION) == "answer here"


def test_user_message():
    assert user_message("What is 2+3?") == "What is 2+3?\n" + PAPER_INSTRUCTION
    assert user_message("What is 2+3?", instruction="paper") == "What is 2+3?\n" + PAPER_INSTRUCTION
    assert user_message("What is 2+3?", instruction="none") == "What is 2+3?"
    with pytest.raises(ValueError, match="unknown value 'fancy'"):
        user_message("q", instruction="fancy")
    with pytest.raises(ValueError, match="non-empty string"):
        user_message("   ")


def test_build_prompt_with_chat_template():
    tok = _tokenizer(CHAT_TEMPLATE)
    text = build_prompt("What is 2+3?", tok)
    assert text == f"<|im_start|>user\nWhat is 2+3?\n{PAPER_INSTRUCTION}<|im_end|>\n<|im_start|>assistant\n"
    bare = build_prompt("What is 2+3?", tok, instruction="none")
    assert bare == "<|im_start|>user\nWhat is 2+3?<|im_end|>\n<|im_start|>assistant\n"
    assert isinstance(tok(text)["input_ids"], list)  # the rendered prompt tokenizes


def test_build_prompt_without_chat_template_is_an_error():
    tok = _tokenizer(None)
    with pytest.raises(ValueError, match="no chat template"):
        build_prompt("What is 2+3?", tok)
