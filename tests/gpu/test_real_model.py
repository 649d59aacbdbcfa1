"""Correctness on real weights, on a GPU: the rollout engine against transformers' `generate`, and NVFP4 through our
kernels against the dequantized reference forward (issue: the small scale on a GPU).

Needs a CUDA device and a converted checkpoint of a real model: QERL_REAL_MODEL=<folder> (the small scale's
results/small/models/smollm2-135m/pretrained/ or base/, written by `qerl prepare-model`). QERL_REAL_MODEL_OUT=<file>
writes the measured numbers as JSON (the GPU run's record). Skipped elsewhere (CPU CI).

1. FP32: greedy completions of the engine equal `generate`'s token for token on 64 GSM8K test prompts (the paper's
   instruction in the model's chat template, left-padded) x 256 tokens. In FP32 rounding cannot decide a greedy
   choice except on exact ties, so every row must match.
2. BF16: the same comparison in bfloat16, where two correct implementations may pick different tokens where the
   top-2 logits nearly tie. The BF16 logit error is measured (max |BF16 - FP32| of the last-prompt-position logits
   over all rows, for the engine and for transformers); every row that diverges must do so at a position whose FP32
   top-2 margin (FP32 forward of the common prefix) is below that error: a near-tie, not a bug.
3. Continuous batching (qerl.evaluate.stream, the evaluations' sampler on CUDA): FP32 greedy completions of the same
   64 prompts in 16 refilled rows equal the one-batch engine's, every row.
4. NVFP4: the model's q/k/v/o/gate/up/down quantized to NVFP4 (round to nearest); every layer's output on the
   real model's own activations equals x @ dequantized(W)^T in FP32 within the kernel tests' tolerance (4e-3
   relative in bfloat16), at the prefill's shapes (where the dispatch dequantizes for cuBLAS) and at decode shapes
   M = 1, 8, 16 (the Triton kernels); the whole model's logits against the dense-dequantized model are recorded.

Run on the GPU machine: `QERL_REAL_MODEL=results/small/models/smollm2-135m/pretrained python -m pytest -q
tests/gpu/test_real_model.py`.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
              pytest.mark.skipif(not os.environ.get("QERL_REAL_MODEL"), reason="QERL_REAL_MODEL (a converted "
                                 "real-model checkpoint folder) is not set")]

N_PROMPTS, N_TOKENS = 64, 256
RESULTS: dict = {}


def _record(key: str, value) -> None:
    RESULTS[key] = value
    out = os.environ.get("QERL_REAL_MODEL_OUT")
    if out:
        Path(out).write_text(json.dumps(RESULTS, indent=2) + "\n")


def _prompts(tokenizer, shared_data_root):
    from qerl.data.benchmarks import load_benchmark
    from qerl.data.prompts import build_prompt

    problems = load_benchmark("gsm8k", shared_data_root, split="test", limit=N_PROMPTS)
    tokenizer.padding_side = "left"
    texts = [build_prompt(p.question, tokenizer, "paper") for p in problems]
    enc = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
    return enc["input_ids"].cuda(), enc["attention_mask"].cuda()


def _load(dtype):
    from qerl.policy.core import load_base

    return load_base(os.environ["QERL_REAL_MODEL"], dtype, "cuda")


def _completions(model, tokenizer, ids, mask):
    """(engine tokens, generate tokens), each a list of per-row token lists cut after the first EOS."""
    from qerl.rl.engine import DecodeEngine
    from qerl.rl.rollout import eos_token_ids

    eos = sorted(eos_token_ids(model, tokenizer))
    eng = DecodeEngine(model, batch=ids.shape[0], max_len=ids.shape[1] + N_TOKENS)
    out = eng.generate(ids, mask, max_new_tokens=N_TOKENS, temperature=0.0, eos_ids=eos)
    ours = [out.tokens[i, : int(out.lengths[i])].tolist() for i in range(ids.shape[0])]
    with torch.no_grad():
        gen = model.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=N_TOKENS,
                             eos_token_id=eos, pad_token_id=tokenizer.pad_token_id)
    theirs = []
    for row in gen[:, ids.shape[1]:].tolist():
        cut = next((j + 1 for j, t in enumerate(row) if t in eos), len(row))
        theirs.append(row[:cut])
    return ours, theirs


def _first_divergence(a: list[int], b: list[int]) -> int | None:
    for j, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return j
    return None if len(a) == len(b) else min(len(a), len(b))


def test_engine_equals_generate_in_fp32(shared_data_root):
    model, tokenizer = _load("float32")
    ids, mask = _prompts(tokenizer, shared_data_root)
    ours, theirs = _completions(model, tokenizer, ids, mask)
    diverged = [i for i in range(len(ours)) if _first_divergence(ours[i], theirs[i]) is not None]
    _record("fp32", {"rows": len(ours), "identical": len(ours) - len(diverged), "diverged_rows": diverged,
                     "tokens_compared": sum(len(t) for t in theirs)})
    assert not diverged, f"FP32 engine != generate on rows {diverged}"


def test_continuous_batching_equals_one_batch_in_fp32(shared_data_root):
    """qerl.evaluate.stream (FP32, greedy, 16 rows refilled as soon as one ends: rows continue in later batches after
    a fresh prefill of prompt + tokens so far) gives each of the 64 prompts the engine's one-batch completion."""
    from qerl.data.benchmarks import load_benchmark
    from qerl.data.prompts import build_prompt
    from qerl.evaluate.stream import sample_stream

    model, tokenizer = _load("float32")
    ids, mask = _prompts(tokenizer, shared_data_root)
    ours, _ = _completions(model, tokenizer, ids, mask)
    texts = [build_prompt(p.question, tokenizer, "paper")
             for p in load_benchmark("gsm8k", shared_data_root, split="test", limit=N_PROMPTS)]
    got = sample_stream(model, tokenizer, texts, max_new_tokens=N_TOKENS, temperature=0.0, top_p=1.0, stop=(),
                        generator=None, batch_size=16, refill_below=1.0)
    diverged = [i for i in range(len(ours)) if got[i][0] != ours[i]]
    _record("continuous_fp32", {"rows": len(ours), "identical": len(ours) - len(diverged), "diverged_rows": diverged})
    assert not diverged, f"FP32 continuous batching != one batch on rows {diverged}"


def test_bf16_divergences_are_near_ties(shared_data_root):
    from qerl.rl.engine import DecodeEngine

    ref, tokenizer = _load("float32")
    model, _ = _load("bfloat16")
    ids, mask = _prompts(tokenizer, shared_data_root)
    with torch.no_grad():  # the BF16 error of the last prompt position's logits, transformers and the engine
        fp32 = ref(input_ids=ids, attention_mask=mask).logits[:, -1].float()
        hf16 = model(input_ids=ids, attention_mask=mask).logits[:, -1].float()
        eng = DecodeEngine(model, batch=ids.shape[0], max_len=ids.shape[1] + 8)
        en16 = eng.prefill(ids, mask).float()
    err = max(float((hf16 - fp32).abs().max()), float((en16 - fp32).abs().max()))
    ours, theirs = _completions(model, tokenizer, ids, mask)
    margins, bad = [], []
    for i in range(len(ours)):
        j = _first_divergence(ours[i], theirs[i])
        if j is None:
            continue
        prefix = ids[i : i + 1, :].tolist()[0] + ours[i][:j]
        keep = mask[i].tolist() + [1] * j
        with torch.no_grad():
            logits = ref(input_ids=torch.tensor([prefix], device="cuda"),
                         attention_mask=torch.tensor([keep], device="cuda")).logits[0, -1].float()
        top2 = logits.topk(2).values
        margin = float(top2[0] - top2[1])
        margins.append({"row": i, "position": j, "fp32_margin": margin})
        if margin >= err:
            bad.append(i)
    _record("bf16", {"rows": len(ours), "identical": len(ours) - len(margins), "bf16_logit_error": err,
                     "divergences": margins, "beyond_error": bad})
    assert not bad, f"BF16 divergences not on near-ties (FP32 margin >= BF16 error {err:.3f}): rows {bad}"


def test_nvfp4_kernels_equal_the_dequantized_forward(shared_data_root):
    """Every NVFP4 layer's kernel output on the real model's own activations vs x @ dequantized(W)^T in FP32 (the
    kernel tests' bound, 4e-3 relative in bfloat16); the whole model's logits are recorded beside it."""
    from qerl.layers import QuantLinear
    from qerl.policy.formats import quantize_model

    model, tokenizer = _load("bfloat16")
    quantize_model(model, "nvfp4")
    ids, mask = _prompts(tokenizer, shared_data_root)
    errors: dict[str, float] = {}

    small: dict[str, float] = {}
    busy: set[str] = set()

    def rel(out, x, layer):
        ref = torch.nn.functional.linear(x.float(), layer.weight.float(),
                                         None if layer.bias is None else layer.bias.float())
        return float((out.float() - ref).norm() / ref.norm())

    def check(name):
        def hook(layer, inputs, output):
            if name in busy:  # the decode-shape calls below run this hook again
                return
            busy.add(name)
            try:
                errors[name] = rel(output, inputs[0], layer)  # prefill shapes: dequantize + cuBLAS in the dispatch
                for m in (1, 8, 16):  # decode shapes, where the dispatch runs the Triton W4A16 kernels
                    x = inputs[0].reshape(-1, inputs[0].shape[-1])[-m:].contiguous()
                    small[f"{name}@M{m}"] = rel(layer(x), x, layer)
            finally:
                busy.discard(name)
        return hook

    handles = [m.register_forward_hook(check(n)) for n, m in model.named_modules() if isinstance(m, QuantLinear)]
    with torch.no_grad():
        ours = model(input_ids=ids, attention_mask=mask).logits.float()
        for h in handles:
            h.remove()
        for module in list(model.modules()):  # the same model with dense layers holding the dequantized weights
            for child_name, child in list(module.named_children()):
                if isinstance(child, QuantLinear):
                    dense = torch.nn.Linear(child.in_features, child.out_features, bias=child.bias is not None,
                                            device="cuda", dtype=torch.bfloat16)
                    dense.weight.copy_(child.weight)
                    if child.bias is not None:
                        dense.bias.copy_(child.bias)
                    setattr(module, child_name, dense)
        ref = model(input_ids=ids, attention_mask=mask).logits.float()
    keep = mask.bool()
    logits_rel = float((ours - ref)[keep].norm() / ref[keep].norm())
    agree = float((ours[keep].argmax(-1) == ref[keep].argmax(-1)).float().mean())
    worst, worst_small = max(errors, key=errors.get), max(small, key=small.get)
    _record("nvfp4", {"layers": len(errors), "max_layer_rel_error": errors[worst], "worst_layer": worst,
                      "max_decode_rel_error": small[worst_small], "worst_decode": worst_small,
                      "tolerance": 4e-3, "logits_rel_error": logits_rel, "top1_agreement": agree})
    assert len(errors) > 0 and errors[worst] < 4e-3, f"NVFP4 vs dequantized reference: {worst} {errors[worst]:.2e}"
    assert small[worst_small] < 4e-3, f"NVFP4 kernels vs dequantized reference: {worst_small} {small[worst_small]:.2e}"
