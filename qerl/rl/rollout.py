"""Rollouts and log-probs from one model instance: batched sampling with a KV cache, and teacher-forced log-probs.

Why our own loop rather than a second inference engine: the paper's speed comes from the 4-bit weights, and QeRL
serves rollouts and log-probs from the same quantized model; here the policy that samples is the module whose
log-probs are trained. On CUDA the static-shape engine (qerl.rl.engine) samples from it: it reads the frozen
weights and the RMSNorm weights in place (so AQN, applied to that module around `sample`, provably changes the
rollout policy) and copies in only the LoRA factors, the q/k/v biases and, for BF16 bases, the concatenated q/k/v
weights, refreshed before every generation, so an optimizer step is always seen. The loop records the entropy of
each sampling distribution (after temperature and top-p), the quantity of the paper's Fig. 3/5/14.

    batch = sample(model, tokenizer, prompts, group_size=8, max_new_tokens=96, temperature=1.0, top_p=1.0,
                   generator=torch.Generator().manual_seed(0))
    logp, entropy = sequence_logprobs(model, batch.input_ids, batch.attention_mask, batch.prompt_len,
                                      with_entropy=True)  # [N, L] each, aligned with batch.completion_ids

Stopping: a sequence ends at an EOS id (the tokenizer's and the model's) or once its text ends a stop string such as
`</answer>` (matched on the decoded text, so a stop string split across tokens is found too); the completion keeps
the stop tokens and the EOS; `truncated` marks the ones cut by max_new_tokens, for DAPO's overlong filter.
"""
from __future__ import annotations

import inspect
import weakref
from dataclasses import dataclass

import torch
import torch.utils.checkpoint

from qerl.rl.sampling import top_p_filter

__all__ = ["RolloutBatch", "eos_token_ids", "sample", "sequence_logprobs", "engine_for", "release_engine"]


@dataclass
class RolloutBatch:
    """B prompts x G samples, left-padded prompts followed by right-padded completions.

    Attributes:
        input_ids: [N, P + L] prompt and completion tokens (N = B * G; row i belongs to prompt i // G).
        attention_mask: [N, P + L] 1 on real tokens.
        completion_mask: [N, P + L] 1 on the completion tokens that were sampled (stop tokens and EOS included).
        prompt_len: P, the padded prompt width.
        texts: the decoded completions (special tokens removed).
        lengths: [N] completion lengths in tokens.
        truncated: [N] True where max_new_tokens cut the completion.
        entropy: [N, L] entropy (nats) of the distribution each completion token was sampled from, 0 on padding.
        sample_logp: [N, L] log-prob of each sampled token under that distribution, 0 on padding.
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    completion_mask: torch.Tensor
    prompt_len: int
    texts: list[str]
    lengths: torch.Tensor
    truncated: torch.Tensor
    entropy: torch.Tensor
    sample_logp: torch.Tensor

    @property
    def completion_ids(self) -> torch.Tensor:
        return self.input_ids[:, self.prompt_len :]


def eos_token_ids(model, tokenizer) -> set[int]:
    """Every token id that ends a sequence: the tokenizer's EOS and the model's generation_config / config EOS."""
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


def _stop_candidates(tokenizer, stop_strings: tuple[str, ...]) -> torch.Tensor:
    """Ids of the tokens whose text contains the last character of a stop string: only after one of those can a
    stop string have just been completed, so only those rows pay for decoding their tail."""
    last_chars = {s[-1] for s in stop_strings if s}
    pieces = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
    return torch.tensor([i for i, p in enumerate(pieces) if p and any(c in p for c in last_chars)], dtype=torch.long)


_TAIL_TOKENS = 24  # tokens decoded to look for a stop string that spans several tokens


_PROMPT_ALIGN = 64  # prompt widths are padded to a multiple of this, so engines (and their graphs) are reused


def check_positions(model, longest_prompt: int, max_new_tokens: int) -> None:
    """Raise ValueError when the longest prompt plus the generation budget passes the model's
    max_position_embeddings (RoPE positions beyond it are not what the model was trained on)."""
    limit = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    if isinstance(limit, int) and longest_prompt + max_new_tokens > limit:
        raise ValueError(f"max_new_tokens = {max_new_tokens} plus the longest prompt ({longest_prompt} tokens) "
                         f"exceeds the model's max_position_embeddings = {limit}; lower the generation budget")


def seed_device_rng(generator: torch.Generator | None) -> None:
    """Seed the torch RNG of the model's device from `generator` (the decode engine samples from that RNG, inside
    its CUDA graphs); nothing when there is no generator."""
    if generator is not None:
        torch.manual_seed(int(torch.randint(0, 2**62, (1,), generator=generator, device=generator.device)))


def _engine_usable(model) -> bool:
    """The static-shape engine runs this model: CUDA and a Qwen2/Llama layout. (A rollout under per-forward AQN, whose
    hooks the engine's fused RMSNorm would bypass, asks for the eager loop itself: Policy.eager_rollout.) The engine
    module, and qerl_kernels with it, is imported only for a CUDA model: a CPU job's first rollout paid ~0.3 s of
    imports for nothing. On the CPU the eager loop is also the faster one: forced onto the engine, a tiny training
    job's RL steps took 1.5-2.8x as long and its evaluation 2.1-3.5x (docs/TINY_TIME.md says why)."""
    if not next(model.parameters()).is_cuda:
        return False
    from qerl.rl.engine import supports

    return supports(model)


@torch.no_grad()
def sample(model, tokenizer, prompts: list[str], *, group_size: int, max_new_tokens: int, temperature: float = 1.0,
           top_p: float = 1.0, generator: torch.Generator | None = None,
           stop_strings: tuple[str, ...] = ("</answer>",), engine: bool | None = None,
           max_rows: int | None = None) -> RolloutBatch:
    """Sample `group_size` completions for each prompt.

    Two paths with the same result layout: on CUDA (engine=None) the static-shape engine (qerl.rl.engine: CUDA
    graphs, fused projections; rows run to the longest completion, checked for EOS every 8 steps; its sampling
    uses the torch RNG, seeded from `generator`); otherwise the eager loop, where finished rows leave the batch (and
    the KV cache). engine=True forces the engine (also on CPU, for tests), False the eager loop.

    Args:
        model: a causal LM (transformers, optionally peft-wrapped, quantized or not).
        tokenizer: its tokenizer (pad and eos tokens set).
        prompts: B prompt texts, already chat-formatted.
        group_size: G samples per prompt.
        max_new_tokens: completion budget.
        temperature: > 0 samples from softmax(logits / T); 0 is greedy.
        top_p: nucleus sampling mass (1.0 = off).
        generator: torch RNG for the sampling (on the model's device).
        stop_strings: strings that end a completion (besides EOS), kept at its end.
        engine: True / False forces the engine / the eager loop; None picks (see above). A caller whose model
            carries forward hooks the engine would bypass (per-forward AQN: Policy.eager_rollout) passes False.
        max_rows: sample at most this many rows together (whole groups; at least one group): bounds the KV cache.
            The chunks are sampled in order with the same generator and joined into one batch.

    Returns:
        A RolloutBatch with N = B * G rows.

    Raises:
        ValueError: on an empty prompt list, group_size < 1, max_new_tokens < 1, top_p outside (0, 1], temperature
            < 0, or prompt + max_new_tokens beyond the model's max_position_embeddings.
    """
    if not prompts or group_size < 1 or max_new_tokens < 1:
        raise ValueError(f"sample: need prompts, group_size >= 1 and max_new_tokens >= 1 "
                         f"(got {len(prompts)} prompts, G={group_size}, max_new_tokens={max_new_tokens})")
    if not 0 < top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")
    if not temperature >= 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    if max_rows is not None and len(prompts) * group_size > max_rows:
        per = max(1, max_rows // group_size)
        return _concat([sample(model, tokenizer, prompts[i:i + per], group_size=group_size,
                               max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p,
                               generator=generator, stop_strings=stop_strings, engine=engine)
                        for i in range(0, len(prompts), per)], tokenizer.pad_token_id)
    if engine or (engine is None and _engine_usable(model)):
        return _sample_engine(model, tokenizer, prompts, group_size, max_new_tokens, temperature, top_p, generator,
                              stop_strings)
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    rows = [p for p in prompts for _ in range(group_size)]
    distinct = list(dict.fromkeys(rows))  # the prefill runs once per distinct prompt (_shared_prefill)
    enc = tokenizer(distinct, return_tensors="pt", padding=True, padding_side="left", add_special_tokens=False)
    where = {p: i for i, p in enumerate(distinct)}
    row_of = torch.tensor([where[p] for p in rows], dtype=torch.long, device=device)  # [N] -> its distinct prompt
    unique_ids, unique_attn = enc["input_ids"].to(device), enc["attention_mask"].to(device)  # [U, P]
    prompt_ids, prompt_attn = unique_ids[row_of], unique_attn[row_of]  # [N, P]
    attn = prompt_attn  # [A, P + t]: grows as tokens are sampled, loses the rows that finish
    n, plen = prompt_ids.shape
    check_positions(model, plen, max_new_tokens)
    pad = tokenizer.pad_token_id
    eos = torch.tensor(sorted(eos_token_ids(model, tokenizer)), dtype=torch.long, device=device)
    stop_tokens = _stop_candidates(tokenizer, stop_strings).to(device) if stop_strings else None

    tokens = torch.full((n, max_new_tokens), pad, dtype=torch.long, device=device)  # [N, L]
    entropy = torch.zeros((n, max_new_tokens), dtype=torch.float32, device=device)  # [N, L]
    sample_logp = torch.zeros((n, max_new_tokens), dtype=torch.float32, device=device)  # [N, L]
    done = torch.zeros(n, dtype=torch.bool, device=device)  # [N]
    lengths = torch.zeros(n, dtype=torch.long, device=device)  # [N]
    alive = torch.arange(n, device=device)  # [A] rows still sampling
    position = attn.long().cumsum(-1) - 1  # [N, P]
    position.masked_fill_(attn == 0, 1)
    cache_arg = kv_cache_arg(model)
    cache, logits = _shared_prefill(model, cache_arg, unique_ids, unique_attn, row_of)  # [A, V]
    next_pos = position[:, -1:] + 1  # [A, 1]
    for t in range(max_new_tokens):
        if temperature > 0:
            logp_all = torch.log_softmax(top_p_filter(logits / temperature, top_p), dim=-1)  # [A, V]
            probs = logp_all.exp()
            tok = torch.multinomial(probs, 1, generator=generator).squeeze(1)  # [A]
            ent = -(probs * logp_all.masked_fill(probs == 0, 0.0)).sum(-1)  # [A]
        else:
            logp_all = torch.log_softmax(logits, dim=-1)  # [A, V]
            tok = logits.argmax(-1)  # [A]
            ent = torch.zeros_like(tok, dtype=torch.float32)
        tokens[alive, t] = tok
        entropy[alive, t] = ent
        sample_logp[alive, t] = logp_all.gather(-1, tok.unsqueeze(1)).squeeze(1)
        lengths[alive] += 1
        finished = torch.isin(tok, eos)  # [A]
        if stop_tokens is not None:
            cands = torch.isin(tok, stop_tokens).nonzero().flatten()  # [C] rows whose token may end a stop string
            if len(cands):  # their tails decoded in one call (~4 candidates a row: the '>' of <think>, </think>...)
                tails = tokenizer.batch_decode(tokens[alive[cands], max(0, t + 1 - _TAIL_TOKENS) : t + 1],
                                               skip_special_tokens=True)
                finished[cands] |= torch.tensor([any(s in tail for s in stop_strings) for tail in tails],
                                                device=device)
        done[alive[finished]] = True
        if t == max_new_tokens - 1 or bool(finished.all()):
            break
        if bool(finished.any()):
            keep = (~finished).nonzero().flatten()  # [A']
            cache.batch_select_indices(keep)
            alive, tok, attn, next_pos = alive[keep], tok[keep], attn[keep], next_pos[keep]
        attn = torch.cat([attn, attn.new_ones(attn.shape[0], 1)], dim=1)  # [A, P + t + 1]
        out = model(input_ids=tok.unsqueeze(1), attention_mask=attn, position_ids=next_pos, use_cache=True,
                    **{cache_arg: cache})
        cache, logits = getattr(out, cache_arg), out.logits[:, -1, :].float()
        next_pos = next_pos + 1
    width = int(lengths.max())
    tokens, entropy, sample_logp = tokens[:, :width], entropy[:, :width], sample_logp[:, :width]
    comp_mask = torch.arange(width, device=device).unsqueeze(0) < lengths.unsqueeze(1)  # [N, L]
    input_ids = torch.cat([prompt_ids, tokens], dim=1)  # [N, P + L]
    attention = torch.cat([prompt_attn, comp_mask.long()], dim=1)  # [N, P + L]
    completion_mask = torch.cat([torch.zeros_like(prompt_ids), comp_mask.long()], dim=1)  # [N, P + L]
    texts = tokenizer.batch_decode(tokens, skip_special_tokens=True)
    model.train(was_training)
    return RolloutBatch(input_ids, attention, completion_mask, plen, texts, lengths.cpu(), (~done).cpu(),
                        entropy.cpu(), sample_logp.cpu())


def _shared_prefill(model, cache_arg: str, ids: torch.Tensor, attn: torch.Tensor, row_of: torch.Tensor):
    """The prompt pass of the eager loop, once per distinct prompt: (KV cache, last-position float logits [N, V]),
    both gathered to the N rows (`row_of`: each row's distinct prompt).

    Why: the G samples of a GRPO group (and lm-eval's repeats of a problem) share their prompt, and the prompt is
    most of a tiny-scale sequence (~80 of ~100 tokens), so the prefill of every row was most of a rollout's prompt
    work. On the CPU a row's numbers do not depend on the other rows of the batch (every op is row by row at these
    shapes), so the cache and logits are the ones a pass over all N rows gives, bit for bit
    (tests/rl/test_rollout.py checks it); sampling then goes on exactly as before.
    """
    position = attn.long().cumsum(-1) - 1  # [U, P]
    position.masked_fill_(attn == 0, 1)
    out = model(input_ids=ids, attention_mask=attn, position_ids=position, use_cache=True)
    cache, logits = getattr(out, cache_arg), out.logits[:, -1, :].float()  # [U, V]
    if ids.shape[0] == row_of.shape[0]:  # every prompt distinct: the rows are the distinct prompts, in order
        return cache, logits
    cache.batch_select_indices(row_of)
    return cache, logits[row_of]


def _concat(parts: list[RolloutBatch], pad: int) -> RolloutBatch:
    """One RolloutBatch from several: prompts left-padded to the widest, completions right-padded to the longest."""
    plen = max(b.prompt_len for b in parts)
    width = max(b.input_ids.shape[1] - b.prompt_len for b in parts)

    def widen(t: torch.Tensor, b: RolloutBatch, fill) -> torch.Tensor:  # [n, P_b + L_b] -> [n, plen + width]
        left = t.new_full((t.shape[0], plen - b.prompt_len), fill)
        right = t.new_full((t.shape[0], width - (t.shape[1] - b.prompt_len)), fill)
        return torch.cat([left, t, right], 1)

    def tail(t: torch.Tensor) -> torch.Tensor:  # [n, L_b] -> [n, width], zeros after
        return torch.cat([t, t.new_zeros((t.shape[0], width - t.shape[1]))], 1)

    return RolloutBatch(torch.cat([widen(b.input_ids, b, pad) for b in parts]),
                        torch.cat([widen(b.attention_mask, b, 0) for b in parts]),
                        torch.cat([widen(b.completion_mask, b, 0) for b in parts]), plen,
                        [t for b in parts for t in b.texts], torch.cat([b.lengths for b in parts]),
                        torch.cat([b.truncated for b in parts]), torch.cat([tail(b.entropy) for b in parts]),
                        torch.cat([tail(b.sample_logp) for b in parts]))


# One decode engine (one shape) per model, kept beside the model (never in it), under a weak key: the engine holds
# the model's submodules and only a weak proxy of the model object, so the entry goes when the model does.
_ENGINES: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def engine_for(model, batch: int, max_len: int):
    """The decode engine for `model` at this shape: reused while the shape is the same, rebuilt otherwise.

    The cache is keyed weakly on the model; the engine refers to the model only through a weak proxy, so dropping
    the model frees the engine (its KV cache and graphs) too. `release_engine(model)` frees it at once.
    """
    from qerl.rl.engine import DecodeEngine

    eng = _ENGINES.pop(model, None)
    if eng is None or eng.batch != batch or eng.max_len != max_len:
        del eng
        eng = DecodeEngine(weakref.proxy(model), batch, max_len)
    _ENGINES[model] = eng
    return eng


def release_engine(model) -> None:
    """Drop the cached decode engine of `model` (its KV cache and CUDA graphs), if any."""
    _ENGINES.pop(model, None)


def _sample_engine(model, tokenizer, prompts, group_size, max_new_tokens, temperature, top_p, generator,
                   stop_strings) -> RolloutBatch:
    device = next(model.parameters()).device
    texts_in = [p for p in prompts for _ in range(group_size)]
    enc = tokenizer(texts_in, return_tensors="pt", padding=True, padding_side="left", add_special_tokens=False)
    ids, attn = enc["input_ids"], enc["attention_mask"]
    pad = tokenizer.pad_token_id
    width = -(-ids.shape[1] // _PROMPT_ALIGN) * _PROMPT_ALIGN
    if width > ids.shape[1]:  # extra left padding: engines and graphs are reused across steps
        extra = width - ids.shape[1]
        ids = torch.cat([torch.full((ids.shape[0], extra), pad, dtype=ids.dtype), ids], 1)
        attn = torch.cat([torch.zeros((attn.shape[0], extra), dtype=attn.dtype), attn], 1)
    n, plen = ids.shape
    check_positions(model, int(attn.sum(1).max()), max_new_tokens)
    ids, attn = ids.to(device), attn.to(device)
    eng = engine_for(model, n, plen + max_new_tokens)
    seed_device_rng(generator)
    eos = sorted(eos_token_ids(model, tokenizer))
    out = eng.generate(ids, attn, max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p, eos_ids=eos)
    tokens, lengths, done = out.tokens.cpu(), out.lengths.cpu().clone(), out.finished.cpu().clone()
    if stop_strings:  # cut each row after the token that completes its first stop string (before its EOS, if any)
        cands = _stop_candidates(tokenizer, stop_strings)
        hits = torch.isin(tokens, cands)
        for row, col in hits.nonzero().tolist():  # row-major: each row's candidates in column order
            if col >= lengths[row]:
                continue  # after the row's end (its EOS, or a stop string found earlier)
            tail = tokenizer.decode(tokens[row, max(0, col + 1 - _TAIL_TOKENS):col + 1], skip_special_tokens=True)
            if any(st in tail for st in stop_strings):
                lengths[row], done[row] = col + 1, True
    width_c = int(lengths.max())
    comp_mask = torch.arange(width_c).unsqueeze(0) < lengths.unsqueeze(1)  # [N, L]
    tokens = tokens[:, :width_c].masked_fill(~comp_mask, pad)
    entropy = out.entropy.cpu()[:, :width_c].masked_fill(~comp_mask, 0.0)
    sample_logp = out.logp.cpu()[:, :width_c].masked_fill(~comp_mask, 0.0)
    input_ids = torch.cat([ids.cpu(), tokens], 1).to(device)
    attention = torch.cat([attn.cpu(), comp_mask.long()], 1).to(device)
    completion_mask = torch.cat([torch.zeros_like(ids.cpu()), comp_mask.long()], 1).to(device)
    texts = tokenizer.batch_decode(tokens, skip_special_tokens=True)
    return RolloutBatch(input_ids, attention, completion_mask, plen, texts, lengths, ~done, entropy, sample_logp)


def kv_cache_arg(model) -> str:
    """The name under which the model's forward takes and returns its KV cache: `cache` in transformers >= 5.24
    (our CPU tests), `past_key_values` in earlier 5.x releases (the GPU image's 5.17), which 5.24 deprecates."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return "cache" if "cache" in inspect.signature(base.forward).parameters else "past_key_values"


#: elements of float logits one `sequence_logprobs` pass may hold at once (2**26: 256 MiB, with its log-softmax and
#: their gradients ~1 GiB); larger passes run in row chunks (real vocabularies: SmolLM2's 49k, Qwen's 152k tokens);
#: the tiny scale's passes are far below it. At 2**28 8 training jobs on one H100 (small scale, run 11) ran out of
#: memory asking for a chunk's 0.99 GiB
LOGITS_BUDGET = 2**26

#: bytes of MLP activations one no-grad `sequence_logprobs` pass may hold at once, reckoned at 16 bytes per token and
#: intermediate channel (the gate and up products in bfloat16, peft's LoRA term and its sum in float32); larger passes
#: run in row chunks. Paper scale, 7B on the H100 (results/measured/h100/paper_random, run 3): the old log-probs of 48
#: rows x 4,296 tokens in one pass asked for 14.5 GiB in one MLP and BF16 LoRA ran out of memory; at 4 GiB that is 3
#: rows a pass (each ~40k tokens x 7B: compute-bound). The small scale's 128 rows x ~500 tokens x 1,536 channels
#: (1.6 GB) stay one pass; the tiny scale's are far below it
ACTIVATIONS_BUDGET = 2**32


def _pass_rows(model, width: int, n: int) -> int:
    """Rows of `width` tokens one no-grad pass of `model` may take under ACTIVATIONS_BUDGET (n when the model names
    no intermediate size)."""
    inter = int(getattr(getattr(model, "config", None), "intermediate_size", 0) or 0)
    return max(1, ACTIVATIONS_BUDGET // (16 * width * inter)) if inter else n


def _vocab_size(model) -> int:
    config = getattr(model, "config", None)
    return int(getattr(config, "vocab_size", 0) or 0)


def _decoder_and_head(model):
    """(the decoder stack, the LM head) of a transformers causal LM, through a peft wrapper; None otherwise."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    decoder, head = getattr(base, "model", None), getattr(base, "lm_head", None)
    return (decoder, head) if isinstance(decoder, torch.nn.Module) and isinstance(head, torch.nn.Module) else None


def _head_logp(head, hidden: torch.Tensor, target: torch.Tensor, with_entropy: bool = False):
    """Log-probs [n, L] of `target` under the LM head applied to `hidden` [n, L, d] (float32 log-softmax); with
    `with_entropy` (no grad) the pair (log-probs, entropy [n, L])."""
    logp_all = torch.log_softmax(head(hidden).float(), dim=-1)
    logp = logp_all.gather(-1, target.unsqueeze(-1)).squeeze(-1)
    if with_entropy:
        return logp, -(logp_all.exp() * logp_all).sum(-1)
    return logp


def _right_align_on(t: torch.Tensor) -> bool:
    """Whether sequence_logprobs rolls its rows (_right_align): on CUDA, where left padding broke the backward; the
    CPU keeps the left-padded rows (their numbers, and the tiny scale's results, unchanged). Tests patch this to run
    the rolled path on the CPU."""
    return t.is_cuda


def _right_align(input_ids: torch.Tensor, attention_mask: torch.Tensor, prompt_len: int):
    """The rows rolled left by their prompt's left padding (the padding moves to the end), and where each position
    that predicts a completion token (prompt_len - 1 .. width - 2 of the original rows) sits in them: (ids, mask,
    pick [N, L]).

    Why: with left padding, the query of a padding position attends to no key at all. On CUDA the fused attention's
    backward returns NaN for such fully masked rows (H100, torch 2.11, SmolLM2-135M at 448 positions: NaN in the
    query gradient of exactly the padding positions of the top layer, so every LoRA gradient of every update was NaN
    and skipped), although they feed nothing a loss counts. Rolled, every padding position comes after its row's
    tokens and attends to them; the real tokens see the same keys at the same RoPE positions (position ids count
    the mask), so their numbers are those of the left-padded rows up to the kernels' summation order."""
    width = input_ids.shape[1]
    pads = (attention_mask[:, :prompt_len] == 0).sum(1, keepdim=True)  # [N, 1] left padding of each row
    cols = torch.arange(width, device=input_ids.device).unsqueeze(0)
    src = (cols + pads) % width  # rolled[j] = row[(j + pad) % width]
    pick = (torch.arange(prompt_len - 1, width - 1, device=input_ids.device).unsqueeze(0) - pads) % width
    return input_ids.gather(1, src), attention_mask.gather(1, src), pick


def _take(x: torch.Tensor, pick: torch.Tensor) -> torch.Tensor:
    """x[i, pick[i, t]] for every row i: [N, T, d] -> [N, L, d]."""
    return x.gather(1, pick.unsqueeze(-1).expand(-1, -1, x.shape[-1]))


def sequence_logprobs(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, prompt_len: int,
                      with_entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs of the completion tokens under `model` (teacher forcing; grads flow if enabled).

    Args:
        model: the policy.
        input_ids: [N, P + L] prompts and completions (RolloutBatch.input_ids).
        attention_mask: [N, P + L].
        prompt_len: P.
        with_entropy: also return the per-token entropy of the model's distribution (temperature 1).

    Returns:
        (logp [N, L], entropy [N, L] or None), aligned with RolloutBatch.completion_ids.
    """
    n, width = input_ids.shape
    per_row = (width - prompt_len) * _vocab_size(model)  # float logits of one row
    rows = max(1, LOGITS_BUDGET // per_row) if per_row else n  # rows per chunk; n: one pass
    grad = torch.is_grad_enabled()
    parts = _decoder_and_head(model) if rows < n and not (grad and with_entropy) else None
    step = min(_pass_rows(model, width, n), rows if parts is None else n)  # rows a whole pass may take
    if step < n and not grad:
        # whole passes over row chunks: more rows than the decoder's activations may hold (a 7B's 4k-token rows), or a
        # model without a separate decoder and head; each row's numbers are its own
        parts_ = [sequence_logprobs(model, input_ids[i : i + step], attention_mask[i : i + step], prompt_len,
                                    with_entropy) for i in range(0, n, step)]
        return (torch.cat([p[0] for p in parts_]),
                torch.cat([p[1] for p in parts_]) if with_entropy else None)
    target = input_ids[:, prompt_len:]  # [N, L]
    pick = None  # [N, L] where each completion-predicting position sits in the rolled rows
    if _right_align_on(input_ids):
        input_ids, attention_mask, pick = _right_align(input_ids, attention_mask, prompt_len)
    position = attention_mask.long().cumsum(-1) - 1  # [N, P + L]
    position.masked_fill_(attention_mask == 0, 1)
    if parts is not None:
        # many long rows: the decoder once over all of them (one set of kernel launches: the passes are launch-bound
        # at the small scale), then the LM head and the float log-softmax per row chunk, so only one chunk's float
        # logits of a 50k-token vocabulary exist at a time; with grad under activation checkpointing, so the
        # backward recomputes them chunk by chunk too
        decoder, head = parts
        hidden = decoder(input_ids=input_ids, attention_mask=attention_mask, position_ids=position,
                         use_cache=False).last_hidden_state
        hidden = hidden[:, prompt_len - 1 : -1] if pick is None else _take(hidden, pick)
        if grad:
            logp = torch.cat([torch.utils.checkpoint.checkpoint(_head_logp, head, hidden[i : i + rows],
                                                                target[i : i + rows], use_reentrant=False)
                              for i in range(0, n, rows)])
            return logp, None
        chunks = [_head_logp(head, hidden[i : i + rows], target[i : i + rows], with_entropy)
                  for i in range(0, n, rows)]
        if with_entropy:
            return torch.cat([c[0] for c in chunks]), torch.cat([c[1] for c in chunks])
        return torch.cat(chunks), None
    logits = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position,
                   use_cache=False).logits  # [N, P + L, V]
    # [N, L, V]: position t predicts token t + 1
    logits = (logits[:, prompt_len - 1 : -1, :] if pick is None else _take(logits, pick)).float()
    logp_all = torch.log_softmax(logits, dim=-1)  # [N, L, V]
    logp = logp_all.gather(-1, target.unsqueeze(-1)).squeeze(-1)  # [N, L]
    ent = None
    if with_entropy:
        with torch.no_grad():
            ent = -(logp_all.exp() * logp_all).sum(-1)  # [N, L]
    return logp, ent
