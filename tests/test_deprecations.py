"""Our own calls into transformers, peft and torch use their current APIs: a rollout, the policy's log-probs and a
backward pass under gradient checkpointing on the tiny model raise no FutureWarning / DeprecationWarning and log no
deprecation, so the harness keeps working on the releases that remove the old names (pyproject.toml states the
versions tested).

Why a test: every training log of the default DAG carried 150 "`past_key_values` is deprecated ... version 5.40.0"
lines from our sampler before it moved to `cache=`; a warning no one reads becomes a break on upgrade.
Allowed (raised from a library's own call, not ours): peft's PeftModel reads `model.is_gradient_checkpointing`
(peft/peft_model.py), deprecated by transformers 5 in favour of `is_activation_checkpointing`.
"""
from __future__ import annotations

import logging
import warnings

import torch

from qerl.policy import LoraSpec, build_policy
from qerl.data.prompts import build_prompt
from qerl.rl.rollout import sample, sequence_logprobs

ALLOWED = (r"`is_gradient_checkpointing` is deprecated",)  # peft's call (see the module docstring)


class _Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def test_our_calls_use_current_apis(tiny_model, tokenizer):
    handler = _Records()
    library = logging.getLogger("transformers")
    library.addHandler(handler)
    logging.Logger.warning_once.cache_clear()  # transformers logs each deprecation once per process
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", FutureWarning)
            warnings.simplefilter("error", DeprecationWarning)
            for message in ALLOWED:
                warnings.filterwarnings("ignore", message=message)
            policy = build_policy("lora", tiny_model, tokenizer=tokenizer, lora=LoraSpec(rank=2, alpha=4),
                                  gradient_checkpointing=True)
            prompts = [build_prompt("Ann has 3 pens . How many pens does Ann have now ?", tokenizer, "none")]
            batch = sample(policy.model, tokenizer, prompts, group_size=2, max_new_tokens=4, temperature=1.0,
                           generator=torch.Generator().manual_seed(0), engine=False)
            policy.model.train()
            logp = sequence_logprobs(policy.model, batch.input_ids, batch.attention_mask, batch.prompt_len)[0]
            logp.sum().backward()
    finally:
        library.removeHandler(handler)
    deprecated = [m for m in handler.messages if "deprecat" in m.lower()]
    assert not deprecated, deprecated
