"""Batched sampling from an in-memory model, and the lm-eval `LM` that serves our generated tasks with it.

Why our own sampler instead of lm-eval's HFLM or `model.generate`:
- the model is whatever the run holds in memory: plain transformers weights, a model whose linears are qerl
  QuantLinear (NVFP4/MXFP4) or bitsandbytes NF4, with or without a peft LoRA adapter; a plain forward with a KV cache
  is all it needs, so every format goes through the same code;
- randomness comes from one `torch.Generator` owned by the evaluation (seeded from the run's seed and the benchmark
  name), never from torch's global RNG, so an evaluation inside a training job neither disturbs nor depends on the
  trainer's random state;
- the stop string is kept: lm-eval's HFLM cuts the text at `until`, which would remove the ``</answer>`` that the
  answer extractor needs to find a closed ``<answer>...</answer>`` pair.

Sampling: temperature scaling, then nucleus (top-p) filtering (the smallest set of most likely tokens whose
probability reaches top_p, always at least one), then one draw; temperature 0 or do_sample=False means greedy.
A sequence ends at an EOS token (not part of the text), at the first occurrence of a stop string (kept, the text
is cut right after it), or after max_new_tokens (finish "length": the evaluation reports how often that happens).
On a CPU finished rows leave the batch (their KV cache rows are dropped); on CUDA the decode engine refills the
rows that end with waiting prompts (qerl.evaluate.stream), so in both a long straggler does not keep paying for the
others. The same seed, batch size and requests give the same completions.

Usage::

    from qerl.evaluate.lm import sample
    outs = sample(model, tokenizer, prompts, max_new_tokens=512, temperature=0.6, top_p=0.95,
                  stop=["</answer>"], generator=torch.Generator().manual_seed(0))

Run the tests: ``pytest tests/evaluate/test_lm.py -q``.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Sequence

import torch
from lm_eval.api.model import LM

from qerl.evaluate.stream import sample_stream
from qerl.rl.rollout import _engine_usable, eos_token_ids
from qerl.rl.rollout import sample as rollout_sample

__all__ = ["Completion", "sample", "QerlLM", "eos_token_ids"]

@dataclass(frozen=True)
class Completion:
    """One sampled continuation.

    Attributes:
        text: the decoded completion (special tokens skipped; ends with the stop string when finish == "stop").
        n_tokens: generated tokens, the EOS token included when there was one.
        finish: "stop" (a stop string), "eos" (an EOS token) or "length" (max_new_tokens reached).
    """

    text: str
    n_tokens: int
    finish: str


def _check_sampling(temperature: float, top_p: float, max_new_tokens: int) -> None:
    if not isinstance(max_new_tokens, int) or isinstance(max_new_tokens, bool) or max_new_tokens < 1:
        raise ValueError(f"evaluate.max_new_tokens must be a positive integer, got {max_new_tokens!r}")
    if not temperature >= 0:
        raise ValueError(f"evaluate.temperature must be >= 0, got {temperature!r}")
    if not 0 < top_p <= 1:
        raise ValueError(f"evaluate.top_p must be in (0, 1], got {top_p!r}")


def sample(model, tokenizer, prompts: Sequence[str], *, max_new_tokens: int, temperature: float = 0.6,
           top_p: float = 0.95, stop: Sequence[str] = ("</answer>",), generator: torch.Generator | None = None,
           batch_size: int = 32, progress: bool = False, continuous: bool | None = None,
           refill_below: float = 0.25) -> list[Completion]:
    """Sample one completion per prompt, `batch_size` prompts at a time, in the order given.

    Args:
        model: a causal LM taking input_ids / attention_mask / position_ids / cache (any transformers
            model, quantized or not, peft-wrapped or not). Run in eval mode and inference mode (no dropout, and
            gradient checkpointing, which would switch the KV cache off, is inactive); its mode is restored after.
        tokenizer: its tokenizer; prompts are encoded with add_special_tokens=False (they are chat-formatted
            already) and left padding (padding_side is set to "left" for the call and restored).
        prompts: the full prompt texts.
        max_new_tokens: generation limit per completion.
        temperature: 0 for greedy decoding.
        top_p: nucleus sampling mass (1.0 disables it).
        stop: stop strings, kept at the end of the text.
        generator: the torch.Generator that draws the tokens (on the model's device); None uses torch's global RNG.
        batch_size: prompts per forward batch.
        progress: a progress bar over batches on stderr.
        continuous: refill the decode engine's rows as they end (qerl.evaluate.stream); None: wherever the engine
            runs (CUDA); False: fixed batches (the comparison in qerl.profiling.eval_batching).
        refill_below: continuous batching refills when fewer than this fraction of the rows run.

    Returns:
        One Completion per prompt, in order.

    Raises:
        ValueError: bad sampling settings, a tokenizer without a pad token, or prompt + max_new_tokens beyond the
            model's max_position_embeddings.
    """
    _check_sampling(temperature, top_p, max_new_tokens)
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"evaluate.batch_size must be a positive integer, got {batch_size!r}")
    if tokenizer.pad_token_id is None:
        name = getattr(tokenizer, "name_or_path", "")
        raise ValueError(f"tokenizer {name!r} has no pad token; set tokenizer.pad_token")
    if continuous or (continuous is None and _engine_usable(model)):  # continuous batching on the decode engine
        return [Completion(_cut(tokenizer.decode(ids, skip_special_tokens=True), stop, finish), len(ids), finish)
                for ids, finish in sample_stream(model, tokenizer, prompts, max_new_tokens=max_new_tokens,
                                                 temperature=temperature, top_p=top_p, stop=tuple(stop),
                                                 generator=generator, batch_size=batch_size, progress=progress,
                                                 refill_below=refill_below)]
    eos = eos_token_ids(model, tokenizer)
    side = tokenizer.padding_side
    try:
        out: list[Completion] = []
        starts = range(0, len(prompts), batch_size)
        if progress:
            from tqdm import tqdm

            starts = tqdm(starts, desc="sampling", unit="batch", mininterval=5.0)
        for i in starts:
            batch = rollout_sample(model, tokenizer, list(prompts[i : i + batch_size]), group_size=1,
                                   max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p,
                                   generator=generator, stop_strings=tuple(stop))
            for text, n, cut, ids in zip(batch.texts, batch.lengths.tolist(), batch.truncated.tolist(),
                                         batch.completion_ids.tolist()):
                reason = "length" if cut else ("eos" if ids[n - 1] in eos else "stop")
                out.append(Completion(_cut(text, stop, reason), n, reason))
        return out
    finally:
        tokenizer.padding_side = side


def _cut(text: str, stop: Sequence[str], finish: str) -> str:
    """A "stop" completion's text ends right after its stop string (its last token may carry more text)."""
    if finish != "stop":
        return text
    return text[: min(text.find(s) + len(s) for s in stop if s in text)]


# ---- lm-eval -------------------------------------------------------------------------------------------------
_KNOWN_GEN_KWARGS = {"until", "do_sample", "temperature", "top_p", "max_gen_toks"}


def _parse_gen_kwargs(kwargs: dict, default_max: int) -> dict:
    """lm-eval generation_kwargs -> arguments of `sample`. Unknown keys are errors (no silent defaults)."""
    unknown = sorted(set(kwargs) - _KNOWN_GEN_KWARGS)
    if unknown:
        raise ValueError(f"generation_kwargs: unsupported key(s) {unknown}; supported: {sorted(_KNOWN_GEN_KWARGS)}")
    until = kwargs.get("until", [])
    until = [until] if isinstance(until, str) else list(until)
    do_sample = bool(kwargs.get("do_sample", False))
    temperature = float(kwargs.get("temperature", 0.0)) if do_sample else 0.0
    return {"stop": tuple(until), "temperature": temperature, "top_p": float(kwargs.get("top_p", 1.0)),
            "max_new_tokens": int(kwargs.get("max_gen_toks", default_max))}


class QerlLM(LM):
    """lm-eval language model over an in-memory model: generate_until through `sample`; no loglikelihood.

    Every request's Completion (text, token count, finish reason) is kept in `self.log`, in request order, so the
    evaluation can report completion lengths and truncations next to lm-eval's metrics.

    Args:
        model: the in-memory model (any format, with or without a peft adapter).
        tokenizer: its tokenizer.
        generator: the sampling generator (see `sample`).
        batch_size: prompts per forward batch.
        default_max_new_tokens: used when a request has no max_gen_toks.
        progress: progress bars over sampling batches on stderr.
    """

    def __init__(self, model, tokenizer, *, generator: torch.Generator | None, batch_size: int = 32,
                 default_max_new_tokens: int = 256, progress: bool = False):
        super().__init__()
        self.model, self.tokenizer, self.generator, self.progress = model, tokenizer, generator, progress
        self.batch_size, self.default_max_new_tokens = batch_size, default_max_new_tokens
        self.log: list[tuple[str, Completion]] = []  # (prompt, completion), in request order

    @property
    def tokenizer_name(self) -> str:
        return str(getattr(self.tokenizer, "name_or_path", "") or type(self.tokenizer).__name__)

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        """Sample every request; requests with equal generation settings are batched together, order is kept.

        Raises:
            ValueError: unsupported generation_kwargs.
        """
        groups: dict[str, list[int]] = {}
        parsed: dict[str, dict] = {}
        for i, req in enumerate(requests):
            gen_kwargs = req.args[1] if len(req.args) > 1 else {}
            key = json.dumps(gen_kwargs, sort_keys=True, default=str)
            if key not in parsed:
                parsed[key] = _parse_gen_kwargs(dict(gen_kwargs), self.default_max_new_tokens)
            groups.setdefault(key, []).append(i)
        results: list[Completion | None] = [None] * len(requests)
        for key, indices in groups.items():
            prompts = [requests[i].args[0] for i in indices]
            outs = sample(self.model, self.tokenizer, prompts, generator=self.generator, batch_size=self.batch_size,
                          progress=self.progress and not disable_tqdm, **parsed[key])
            for i, c in zip(indices, outs):
                results[i] = c
        for req, c in zip(requests, results):
            self.log.append((req.args[0], c))
        return [c.text for c in results]

    def loglikelihood(self, requests, disable_tqdm: bool = False):
        raise NotImplementedError("QerlLM serves generate_until tasks only (the math benchmarks are generative)")

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False):
        raise NotImplementedError("QerlLM serves generate_until tasks only (the math benchmarks are generative)")
