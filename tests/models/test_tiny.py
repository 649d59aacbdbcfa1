"""The tiny tokenizer and model: round trips, Qwen2 classes, and pretraining that beats the untrained model."""
from __future__ import annotations


import pytest
import torch

from qerl.data.prompts import build_prompt
from qerl.data.tiny import generate_split
from qerl.models.pretrain import _batch, completion_text, encode_examples, pretrain
from qerl.models.tiny import build_model, build_tokenizer


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


def test_tokenizer_round_trips_problems(tokenizer):
    for row in generate_split(0, 50, [1, 2, 3, 4, 5], "t"):
        text = completion_text(row)
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        assert tokenizer.unk_token_id not in ids
        assert tokenizer.decode(ids) == text
        q_ids = tokenizer(build_prompt(row["question"], tokenizer), add_special_tokens=False)["input_ids"]
        assert tokenizer.unk_token_id not in q_ids


def test_numbers_are_split_into_digits(tokenizer):
    assert tokenizer.tokenize("47 + 5") == ["4", "##7", "+", "5"]


def test_model_is_qwen2_with_blocks_that_fit(tokenizer):
    model = build_model(tokenizer)
    assert type(model).__name__ == "Qwen2ForCausalLM"
    for name, mod in model.named_modules():
        if isinstance(mod, torch.nn.Linear) and "lm_head" not in name:
            assert mod.in_features % 32 == 0 and mod.out_features % 32 == 0, name


def test_bad_width_rejected(tokenizer):
    with pytest.raises(ValueError, match="multiple of 32"):
        build_model(tokenizer, hidden_size=48, num_heads=3, num_kv_heads=1)


def _heldout_loss(model, examples, pad_id):
    input_ids, attn, labels = _batch(examples, pad_id)
    with torch.no_grad():
        return model(input_ids=input_ids, attention_mask=attn, labels=labels).loss.item()


def test_pretraining_beats_untrained(tokenizer):
    rows = generate_split(0, 2000, [1, 2], "train")
    held = generate_split(0, 64, [1, 2], "held")
    train_ex = encode_examples(rows, tokenizer, "none")
    held_ex = encode_examples(held, tokenizer, "none")
    model = build_model(tokenizer, seed=0)
    before = _heldout_loss(model, held_ex, tokenizer.pad_token_id)
    stats = pretrain(model, train_ex, steps=80, time_budget_s=600, batch_size=32, lr=3e-3, warmup_steps=10,
                     weight_decay=0.01, seed=0)
    after = _heldout_loss(model, held_ex, tokenizer.pad_token_id)
    assert stats["steps"] == 80
    assert after < 0.6 * before, (before, after)
