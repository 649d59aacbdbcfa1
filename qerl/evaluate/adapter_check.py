"""The adapter check: prove that a LoRA adapter takes part in the forward pass before its model is evaluated.

Why: the released QeRL evaluator never applies the LoRA adapter, so its numbers cannot be trusted. Here, when the
model carries an adapter, `check_adapter_active` first compares the logits of a fixed probe prompt with the adapter
enabled and inside `model.disable_adapter()`; identical logits (an adapter that is absent, disabled or still at its
zero initialisation) stop the evaluation with `AdapterNotActiveError`. `qerl.evaluate.run.evaluate_model` runs it
before any benchmark whenever the model is a peft.PeftModel (or require_adapter=True).

Run the tests: ``pytest tests/evaluate/test_run.py -q``.
"""
from __future__ import annotations

import torch

__all__ = ["PROBE_QUESTION", "AdapterNotActiveError", "check_adapter_active"]

#: the fixed probe of the adapter check (words the tiny tokenizer knows too).
PROBE_QUESTION = "Ann has 3 apples . Ann buys 5 apples . How many apples does Ann have now ?"


class AdapterNotActiveError(ValueError):
    """The model was meant to carry a trained adapter, but the adapter does not change its outputs."""


def _lora_modules(model) -> list[str]:
    from peft.tuners.lora import LoraLayer

    return [name for name, m in model.named_modules() if isinstance(m, LoraLayer)]


@torch.inference_mode()
def check_adapter_active(model, tokenizer, *, question: str = PROBE_QUESTION, atol: float = 0.0,
                         greedy_tokens: int = 16) -> dict:
    """Prove that the adapter takes part in the forward pass: logits with it must differ from logits without it.

    Args:
        model: a peft.PeftModel (LoRA).
        tokenizer: its tokenizer (the probe goes through the chat template like every evaluation prompt).
        question: the probe question.
        atol: the largest |logit difference| still counted as "identical" (0: bit-identical).
        greedy_tokens: length of the greedy continuation compared for information (a weak adapter may change
            logits without changing the argmax; that is not an error).

    Returns:
        {"passed": True, "lora_modules": count, "active_adapters": names, "max_abs_logit_diff": float,
        "greedy_differs": bool, "probe": question}.

    Raises:
        AdapterNotActiveError: not a peft model, no LoRA layer, or logits identical with and without the adapter
            (e.g. an adapter whose lora_B is still zero, or one that was never applied).
    """
    from peft import PeftModel

    from qerl.data.prompts import build_prompt
    from qerl.evaluate.lm import sample

    if not isinstance(model, PeftModel):
        raise AdapterNotActiveError(
            f"an adapter was expected but the model is a {type(model).__name__}, not a peft.PeftModel: the adapter "
            "was never applied (load it with qerl.policy.load_adapter, or build_policy(..., adapter=DIR))")
    lora = _lora_modules(model)
    if not lora:
        raise AdapterNotActiveError("the peft model has no LoRA layer: the adapter's target_modules matched nothing")
    prompt = build_prompt(question, tokenizer, "paper")
    enc = tokenizer(prompt, return_tensors="pt", add_special_tokens=False)
    device = next(model.parameters()).device
    enc = {k: v.to(device) for k, v in enc.items()}
    was_training = model.training
    model.eval()
    try:
        on = model(**enc).logits.float()  # [1, P, V]
        with model.disable_adapter():
            off = model(**enc).logits.float()
            greedy_off = sample(model, tokenizer, [prompt], max_new_tokens=greedy_tokens, temperature=0.0, top_p=1.0,
                                stop=(), batch_size=1)[0].text
        greedy_on = sample(model, tokenizer, [prompt], max_new_tokens=greedy_tokens, temperature=0.0, top_p=1.0,
                           stop=(), batch_size=1)[0].text
    finally:
        model.train(was_training)
    diff = (on - off).abs().max().item()
    report = {"passed": diff > atol, "lora_modules": len(lora), "active_adapters": list(model.active_adapters),
              "max_abs_logit_diff": diff, "greedy_differs": greedy_on != greedy_off, "probe": question}
    if not diff > atol:
        raise AdapterNotActiveError(
            f"the LoRA adapter ({len(lora)} LoRA layers, active: {list(model.active_adapters)}) does not change the "
            f"model: max |logit(with adapter) - logit(without)| = {diff:.3g} <= {atol:g} on the probe prompt. The "
            "adapter is disabled, or untrained (lora_B still zero); evaluating it would report the base model")
    return report
