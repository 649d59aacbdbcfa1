"""NF4 baseline (bitsandbytes, QLoRA defaults) on CPU: conversion, transformers' loader, peft LoRA, memory."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from baselines.nf4 import (
    NF4Config,
    bitsandbytes_cpu_problem,
    bnb_config,
    keep_trainable_layout,
    nf4_linear,
    nf4_nbytes,
    quantize_nf4_,
)
from qerl.layers import quantize_

_PROBLEM = bitsandbytes_cpu_problem()
pytestmark = pytest.mark.skipif(_PROBLEM is not None, reason=str(_PROBLEM))
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def tiny_qwen2(seed: int = 0):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen2Config(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                      tie_word_embeddings=False)
    return Qwen2ForCausalLM(cfg).eval()


def test_layer_uses_qlora_defaults_and_is_accurate():
    import bitsandbytes as bnb

    torch.manual_seed(0)
    lin = nn.Linear(128, 32)
    q = nf4_linear(lin)
    assert isinstance(q, bnb.nn.Linear4bit)
    state = q.weight.quant_state
    assert state.quant_type == "nf4" and state.blocksize == 64 and state.nested  # nested = double quantization
    x = torch.randn(4, 128)
    assert (q(x) - lin(x)).norm() / lin(x).norm() < 0.15


def test_quantize_matches_transformers_loader(tmp_path):
    from transformers import AutoModelForCausalLM

    model = tiny_qwen2()
    model.save_pretrained(tmp_path)
    ids = torch.randint(0, 96, (2, 10))
    with torch.no_grad():
        ref = model(ids).logits
        quantize_nf4_(model)
        ours = model(ids).logits
        loaded = keep_trainable_layout(AutoModelForCausalLM.from_pretrained(
            tmp_path, quantization_config=bnb_config(torch.float32), dtype=torch.float32))
        theirs = loaded(ids).logits
    assert type(model.lm_head) is nn.Linear and type(loaded.lm_head) is nn.Linear
    torch.testing.assert_close(ours, theirs)  # same codes, same (trainable-layout) compute path
    assert (ours - ref).norm() / ref.norm() < 0.2


def test_training_still_works_after_a_no_grad_eval_forward():
    """The RL loop samples (eval, no grad) and then trains the same model: the layer must stay trainable."""
    torch.manual_seed(0)
    lin = nn.Linear(64, 64)  # (bitsandbytes' bf16 repack would break the backward below, or even this forward)
    q = nf4_linear(lin).eval()
    with torch.no_grad():
        q(torch.randn(2, 64))
    x = torch.randn(2, 64, requires_grad=True)
    q.train()(x).sum().backward()
    assert x.grad is not None and torch.isfinite(x.grad).all()


def test_qlora_trains_on_cpu_with_peft_bnb_layer():
    import peft
    from peft.tuners.lora.bnb import Linear4bit as LoraLinear4bit

    model = quantize_nf4_(tiny_qwen2())
    model = peft.get_peft_model(model, peft.LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=TARGETS))
    assert sum(isinstance(m, LoraLinear4bit) for m in model.modules()) == 14
    ids = torch.randint(0, 96, (4, 16), generator=torch.Generator().manual_seed(0))
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    model.train()
    losses = []
    for _ in range(10):
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    assert losses[-1] < losses[0] - 0.3, losses


def test_nf4_memory_is_within_5_percent_of_its_bits():
    model = tiny_qwen2()
    n_quant = sum(m.weight.numel() for n, m in model.named_modules() if n.rsplit(".", 1)[-1] in TARGETS)
    other = sum(p.numel() * p.element_size() for n, p in model.named_parameters()
                if n.rsplit(".", 2)[-2] not in TARGETS)
    quantize_(model, NF4Config())
    # 4-bit codes + 8-bit absmax per 64 + FP32 absmax-of-absmax per 256 blocks (double quantization)
    implied = n_quant * (4 + 8 / 64 + 32 / (64 * 256)) / 8 + other
    assert abs(nf4_nbytes(model) - implied) / implied < 0.05
