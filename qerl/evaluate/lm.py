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
Finished rows leave the batch (their KV cache rows are dropped), so a long straggler does not keep paying for the
others. The same seed, batch size and requests give the same completions on CPU.

Usage::

    from qerl.evaluate.lm import sample
    outs = sample(model, tokenizer, prompts, max_new_tokens=512, temperature=0.6, top_p=0.95,
                  stop=["</answer>"], generator=torch.Generator().manual_seed(0))

Run the tests: ``pytest tests/evaluate/test_lm.py -q``.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Sequence

import torch
from lm_eval.api.model import LM

__all__ = ["Completion", "sample", "QerlLM", "eos_token_ids"]

_TAIL_TOKENS = 24  # tokens decoded at each step to look for a stop string that may span several tokens


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


def eos_token_ids(model: Any, tokenizer: Any) -> set[int]:
    """Every token id that ends a sequence: the tokenizer's EOS and the model's generation_config / config EOS.

    Args:
        model: a transformers model (or peft wrapper).
        tokenizer: its tokenizer.

    Returns:
        The set of ids (may be empty if neither defines one).
    """
    ids: set[int] = set()
    candidates = [getattr(tokenizer, "eos_token_id", None)]
    for holder in (getattr(model, "generation_config", None), getattr(model, "config", None)):
        candidates.append(getattr(holder, "eos_token_id", None) if holder is not None else None)
    for c in candidates:
        if isinstance(c, int):
            ids.add(c)
        elif isinstance(c, (list, tuple)):
            ids.update(int(x) for x in c)
    return ids


def _max_positions(model: Any) -> int | None:
    config = getattr(model, "config", None)
    return getattr(config, "max_position_embeddings", None)


def _model_device(model: Any) -> torch.device:
    for p in model.parameters():
        return p.device
    for b in model.buffers():  # pragma: no cover - a model without parameters
        return b.device
    return torch.device("cpu")  # pragma: no cover


def _next_tokens(logits: torch.Tensor, temperature: float, top_p: float, generator: torch.Generator | None
                 ) -> torch.Tensor:
    """One token per row of `logits` [B, V]: greedy when temperature == 0, else temperature + top-p sampling."""
    if temperature == 0:
        return logits.argmax(dim=-1)  # [B]
    probs = torch.softmax(logits.float() / temperature, dim=-1)  # [B, V]
    if top_p < 1.0:
        sorted_p, order = probs.sort(dim=-1, descending=True)  # [B, V]
        before = sorted_p.cumsum(dim=-1) - sorted_p  # [B, V] mass strictly above each token
        sorted_p = sorted_p.masked_fill(before >= top_p, 0.0)  # the first token always survives (before = 0)
        probs = torch.zeros_like(probs).scatter_(-1, order, sorted_p)  # [B, V]
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)  # [B]


def _check_sampling(temperature: float, top_p: float, max_new_tokens: int) -> None:
    if not isinstance(max_new_tokens, int) or isinstance(max_new_tokens, bool) or max_new_tokens < 1:
        raise ValueError(f"evaluate.max_new_tokens must be a positive integer, got {max_new_tokens!r}")
    if not temperature >= 0:
        raise ValueError(f"evaluate.temperature must be >= 0, got {temperature!r}")
    if not 0 < top_p <= 1:
        raise ValueError(f"evaluate.top_p must be in (0, 1], got {top_p!r}")


@torch.inference_mode()
def _sample_batch(model, tokenizer, prompts: list[str], max_new_tokens: int, temperature: float, top_p: float,
                  stop: Sequence[str], eos: set[int], generator: torch.Generator | None) -> list[Completion]:
    device = _model_device(model)
    enc = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    input_ids = enc["input_ids"].to(device)  # [B, P]
    attn = enc["attention_mask"].to(device)  # [B, P]
    limit = _max_positions(model)
    if limit is not None and input_ids.shape[1] + max_new_tokens > limit:
        raise ValueError(
            f"evaluate.max_new_tokens = {max_new_tokens} plus the longest prompt ({input_ids.shape[1]} tokens) exceeds "
            f"the model's max_position_embeddings = {limit}; lower evaluate.max_new_tokens"
        )
    batch = len(prompts)
    generated: list[list[int]] = [[] for _ in range(batch)]
    finish: list[str | None] = [None] * batch
    alive = list(range(batch))  # row of the running batch -> index into prompts
    position = (attn.long().cumsum(-1) - 1).clamp(min=0)  # [B, P] left padding: real tokens count from 0
    out = model(input_ids=input_ids, attention_mask=attn, position_ids=position, use_cache=True)
    cache = out.past_key_values
    if cache is None:
        raise RuntimeError(f"{type(model).__name__} returned no KV cache (use_cache=True was ignored); "
                           "sampling needs one")
    logits = out.logits[:, -1, :]  # [B, V]
    next_pos = position[:, -1:] + 1  # [B, 1]
    for step in range(max_new_tokens):
        tokens = _next_tokens(logits, temperature, top_p, generator)  # [B_alive]
        keep = []
        for row, idx in enumerate(alive):
            tok = int(tokens[row])
            generated[idx].append(tok)
            if tok in eos:
                finish[idx] = "eos"
            elif stop:
                tail = tokenizer.decode(generated[idx][-_TAIL_TOKENS:], skip_special_tokens=True)
                if any(s in tail for s in stop):
                    finish[idx] = "stop"
            if finish[idx] is None:
                keep.append(row)
        if step == max_new_tokens - 1 or not keep:
            break
        if len(keep) < len(alive):
            sel = torch.tensor(keep, device=device)
            if not hasattr(cache, "batch_select_indices"):  # pragma: no cover - every transformers Cache has it
                raise RuntimeError(f"cannot drop finished rows from a {type(cache).__name__} KV cache")
            cache.batch_select_indices(sel)
            tokens, attn, next_pos = tokens[sel], attn[sel], next_pos[sel]
            alive = [alive[r] for r in keep]
        attn = torch.cat([attn, attn.new_ones(len(alive), 1)], dim=1)  # [B_alive, P + step + 1]
        out = model(input_ids=tokens[:, None], attention_mask=attn, position_ids=next_pos, past_key_values=cache,
                    use_cache=True)
        cache = out.past_key_values
        logits = out.logits[:, -1, :]
        next_pos = next_pos + 1
    results = []
    for idx in range(batch):
        ids = generated[idx]
        reason = finish[idx] or "length"
        text = tokenizer.decode(ids[:-1] if reason == "eos" else ids, skip_special_tokens=True)
        if reason == "stop":
            cut = min((text.find(s) + len(s) for s in stop if s in text), default=len(text))
            text = text[:cut]
        results.append(Completion(text, len(ids), reason))
    return results


def sample(model, tokenizer, prompts: Sequence[str], *, max_new_tokens: int, temperature: float = 0.6,
           top_p: float = 0.95, stop: Sequence[str] = ("</answer>",), generator: torch.Generator | None = None,
           batch_size: int = 32, progress: bool = False) -> list[Completion]:
    """Sample one completion per prompt, `batch_size` prompts at a time, in the order given.

    Args:
        model: a causal LM taking input_ids / attention_mask / position_ids / past_key_values (any transformers
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
    eos = eos_token_ids(model, tokenizer)
    side, was_training = tokenizer.padding_side, model.training
    tokenizer.padding_side = "left"
    model.eval()
    try:
        out: list[Completion] = []
        starts = range(0, len(prompts), batch_size)
        if progress:
            from tqdm import tqdm

            starts = tqdm(starts, desc="sampling", unit="batch", mininterval=5.0)
        for i in starts:
            out.extend(_sample_batch(model, tokenizer, list(prompts[i : i + batch_size]), max_new_tokens, temperature,
                                     top_p, tuple(stop), eos, generator))
        return out
    finally:
        tokenizer.padding_side = side
        model.train(was_training)


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
            context, gen_kwargs = req.args[0], (req.args[1] if len(req.args) > 1 else {})
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
