"""The tiny scale's tokenizer and Qwen2-architecture model, built in code (no downloads).

Why a real Qwen2 (transformers' `Qwen2ForCausalLM`): AQN perturbs the real RMSNorm classes, LoRA wraps the real
q/k/v/o/gate/up/down projections, and quantization sees the same module names as at paper scale. Every linear
dimension is a multiple of 32 so NVFP4 (blocks of 16) and MXFP4 (blocks of 32) fit.

The tokenizer is a WordPiece vocabulary over the generator's words, the paper's instruction, the <think>/<answer>
tags and the ten digits: a number is split into digits ("12" -> "1", "##2"), which a 100k-parameter model learns to
add far more easily than whole-number tokens. It carries a ChatML-style chat template, so prompts are built the
same way as for the real models (qerl.data.prompts.build_prompt).

Run: `python -m qerl.models.tiny OUT_DIR` writes an untrained model + tokenizer (the `pretrain-tiny` step trains it).
"""
from __future__ import annotations

import sys

from qerl.data.tiny import vocabulary_words

__all__ = ["SPECIAL_TOKENS", "TAG_TOKENS", "CHAT_TEMPLATE", "INSTRUCTION_WORDS", "build_tokenizer", "build_model"]

SPECIAL_TOKENS = ["<pad>", "<unk>", "<|im_start|>", "<|im_end|>"]
TAG_TOKENS = ["<think>", "</think>", "<answer>", "</answer>", "####"]
# Words of the paper's instruction (qerl.data.prompts.PAPER_INSTRUCTION) after punctuation splitting.
INSTRUCTION_WORDS = (
    "Solve following math problem step by The reasoning process and direct answer are enclosed within tags "
    "respectively i e here , ."
).split()
ROLE_WORDS = ["system", "user", "assistant"]
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|> {{ message['role'] }} {{ message['content'] }} <|im_end|> "
    "{% endfor %}{% if add_generation_prompt %}<|im_start|> assistant {% endif %}"
)


def build_tokenizer():
    """A `PreTrainedTokenizerFast` for the tiny scale (WordPiece, digits split, ChatML-style template).

    Returns:
        transformers.PreTrainedTokenizerFast with pad/unk/eos set and `chat_template` filled in.
    """
    from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    digits = [str(d) for d in range(10)]
    words = sorted(set(vocabulary_words()) | set(INSTRUCTION_WORDS) | set(ROLE_WORDS) | {"+", "-", "*", "="})
    vocab_list = SPECIAL_TOKENS + TAG_TOKENS + digits + [f"##{d}" for d in digits] + [w for w in words if w not in TAG_TOKENS]
    vocab = {tok: i for i, tok in enumerate(dict.fromkeys(vocab_list))}
    tok = Tokenizer(models.WordPiece(vocab=vocab, unk_token="<unk>", continuing_subword_prefix="##",
                                     max_input_chars_per_word=100))
    tok.normalizer = normalizers.Strip()
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Punctuation()])
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)
    tok.add_special_tokens([AddedToken(t, normalized=False) for t in SPECIAL_TOKENS])
    tok.add_tokens([AddedToken(t, normalized=False, single_word=False) for t in TAG_TOKENS])
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", unk_token="<unk>", eos_token="<|im_end|>", bos_token=None,
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.padding_side = "left"
    return fast


def build_model(tokenizer, hidden_size: int = 64, intermediate_size: int = 192, num_layers: int = 2,
                num_heads: int = 4, num_kv_heads: int = 2, max_position: int = 320, seed: int = 0):
    """A randomly initialised `Qwen2ForCausalLM` sized for the tiny scale.

    Args:
        tokenizer: the tiny tokenizer (sets vocab size, pad and eos ids).
        hidden_size, intermediate_size: multiples of 32 (NVFP4/MXFP4 blocks).
        num_layers, num_heads, num_kv_heads, max_position: architecture.
        seed: torch seed for the initialisation.

    Raises:
        ValueError: if a linear dimension is not a multiple of 32 or heads do not divide the width.
    """
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    head_dim, rem = divmod(hidden_size, num_heads)
    if rem or num_heads % num_kv_heads:
        raise ValueError(f"hidden_size {hidden_size} / num_heads {num_heads} / num_kv_heads {num_kv_heads} do not divide")
    for name, dim in (("hidden_size", hidden_size), ("intermediate_size", intermediate_size),
                      ("kv width", head_dim * num_kv_heads)):
        if dim % 32:
            raise ValueError(f"{name} = {dim} is not a multiple of 32 (NVFP4/MXFP4 blocks would not fit)")
    config = Qwen2Config(
        vocab_size=len(tokenizer), hidden_size=hidden_size, intermediate_size=intermediate_size,
        num_hidden_layers=num_layers, num_attention_heads=num_heads, num_key_value_heads=num_kv_heads,
        max_position_embeddings=max_position, tie_word_embeddings=True, rms_norm_eps=1e-6, rope_theta=10000.0,
        pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id, bos_token_id=None,
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    return model


if __name__ == "__main__":  # pragma: no cover
    tk = build_tokenizer()
    m = build_model(tk)
    m.save_pretrained(sys.argv[1])
    tk.save_pretrained(sys.argv[1])
