"""Continuous batching for evaluations on the decode engine: rows that end are refilled with waiting prompts.

Why: the engine (qerl.rl.engine) runs a batch until its longest row ends (checked every 8 steps). An evaluation's
completions are mostly short, but a few loop to the token limit (small scale, H100 run 11: GSM8K test at 512 tokens,
mean 123 tokens, 21 of 1319 to the limit), so nearly every batch of plain batching decodes all 512 steps with most
of its rows already finished: GSM8K test at 128 rows is 11 batches x 512 = 5632 decode steps. Here a batch stops at
the first check that finds fewer than a quarter of its rows running; the rows still running go back to the front of
the queue with the tokens they have, and the next batch takes them together with new prompts. Their prompt plus those
tokens is prefilled again (one batched forward: cheap next to hundreds of decode steps) and their sampling goes on
from there: the model's distribution given the tokens so far, as if sampled in one go.

Measured (H100, the small scale's SFT-warmed SmolLM2-135M alone on the GPU, 128 rows, 512 tokens, T 0.6;
`python -m qerl.profiling.eval_batching`, results/measured/h100/small/eval_batching/): GSM8K test 22.7 -> 15.5 s
(pass@1 4.40 -> 4.62 ± 0.58), MATH-500 12.1 -> 11.3 s (37 % of its completions run to the limit, so fewer rows end
early); refilling below half the rows: 25.4 -> 18.0 s and 12.1 -> 13.4 s (more re-prefills of long rows); below a
tenth: 17.6 s and 10.9 s.

One engine (one batch size, one cache length) serves the whole evaluation, so its CUDA graphs are captured once. The
sampling draws from the device's torch RNG, seeded from `generator` before each batch (as qerl.rl.rollout.sample
does), so the same generator, prompts and settings give the same completions; they are not the draws plain batching
would make (same distribution, other samples). Stop strings and EOS end a row as in plain batching (the stop
string kept, EOS counted but not in the text).

    ids_and_finish = sample_stream(model, tokenizer, prompts, max_new_tokens=512, temperature=0.6, top_p=0.95,
                                   stop=("</answer>",), generator=g, batch_size=128)

Run the tests: ``pytest tests/evaluate/test_stream.py -q``.
"""
from __future__ import annotations

from collections import deque
from typing import Sequence

import torch

__all__ = ["sample_stream", "row_end"]


def row_end(prev: list[int], new: list[int], eos: set[int], candidates: set[int], tokenizer,
            stop: Sequence[str]) -> tuple[int, str] | None:
    """Where a row's new tokens end it: (tokens of `new` kept, "eos" | "stop"), or None if it goes on.

    A stop string ends the row after the token that completes it (found by decoding the last tokens up to each
    candidate token, the tokens of `prev` included, so a stop string split across batches is found), unless an EOS
    comes first; an EOS ends it with the EOS kept in the count.
    """
    first_eos = next((k for k, tok in enumerate(new) if tok in eos), None)
    upto = len(new) if first_eos is None else first_eos + 1
    if stop:
        from qerl.rl.rollout import _TAIL_TOKENS

        seq = prev + new
        for k in range(upto):
            if new[k] in candidates:
                end = len(prev) + k + 1
                tail = tokenizer.decode(seq[max(0, end - _TAIL_TOKENS):end], skip_special_tokens=True)
                if any(s in tail for s in stop):
                    return k + 1, "stop"
    return (first_eos + 1, "eos") if first_eos is not None else None


def sample_stream(model, tokenizer, prompts: Sequence[str], *, max_new_tokens: int, temperature: float, top_p: float,
                  stop: Sequence[str], generator: torch.Generator | None, batch_size: int,
                  refill_below: float = 0.25, progress: bool = False) -> list[tuple[list[int], str]]:
    """Sample one completion per prompt with continuous batching; returns, in prompt order, (completion token ids,
    finish) with finish "eos" (the EOS id last), "stop" (the stop string's last token last) or "length".

    Args:
        model, tokenizer: as qerl.evaluate.lm.sample (prompts chat-formatted; the engine must support the model).
        batch_size: rows decoded together (fewer when there are fewer prompts).
        refill_below: a batch stops for a refill when fewer than this fraction of its rows are running (while
            prompts wait; the last batch runs to its end). 0.25: the measured best of 0.5 / 0.25 / 0.1 (above).
    """
    from qerl.rl.rollout import (_PROMPT_ALIGN, _stop_candidates, check_positions, engine_for, eos_token_ids,
                                 seed_device_rng)

    enc = tokenizer(list(prompts), add_special_tokens=False)["input_ids"]
    n = len(enc)
    if n == 0:
        return []
    check_positions(model, max(len(p) for p in enc), max_new_tokens)
    device = next(model.parameters()).device
    eos = set(eos_token_ids(model, tokenizer))
    eos_ids = sorted(eos)
    cands = set(_stop_candidates(tokenizer, tuple(stop)).tolist()) if stop else set()
    pad = tokenizer.pad_token_id

    def align(x: int) -> int:
        return -(-x // _PROMPT_ALIGN) * _PROMPT_ALIGN

    rows = min(batch_size, n)
    max_len = align(max(len(p) for p in enc) + max_new_tokens) + _PROMPT_ALIGN  # any continuation has room
    eng = engine_for(model, rows, max_len)
    gen: list[list[int]] = [[] for _ in range(n)]
    result: list[tuple[list[int], str] | None] = [None] * n
    queue = deque(range(n))
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=n, desc="sampling", unit="completion", mininterval=5.0)
    while queue:
        take = [queue.popleft() for _ in range(min(rows, len(queue)))]
        seqs = [enc[i] + gen[i] for i in take]
        width = align(max(len(s) for s in seqs))
        room = [max_new_tokens - len(gen[i]) for i in take]
        steps = min(max(room), max_len - width)
        ids = torch.full((rows, width), pad, dtype=torch.long)
        attn = torch.zeros((rows, width), dtype=torch.long)
        for j, s in enumerate(seqs):
            ids[j, width - len(s):] = torch.tensor(s, dtype=torch.long)
            attn[j, width - len(s):] = 1
        for j in range(len(seqs), rows):  # filler rows (the last batches): a copy of row 0, ended from the start
            ids[j], attn[j] = ids[0], attn[0]
        limits = torch.tensor([min(r, steps) for r in room] + [0] * (rows - len(seqs)), device=device)
        seed_device_rng(generator)
        out = eng.generate(ids.to(device), attn.to(device), max_new_tokens=steps, temperature=temperature,
                           top_p=top_p, eos_ids=eos_ids, row_limits=limits,
                           min_active=int(rows * refill_below) if queue else 0)
        tokens = out.tokens.cpu()
        back = []
        for j, i in enumerate(take):
            new = tokens[j, :room[j]].tolist()  # the steps run (<= steps), at most the row's room
            end = row_end(gen[i], new, eos, cands, tokenizer, stop)
            if end is not None:
                gen[i] += new[:end[0]]
                result[i] = (gen[i], end[1])
            elif len(gen[i]) + len(new) >= max_new_tokens:
                gen[i] += new
                result[i] = (gen[i], "length")
            else:
                gen[i] += new
                back.append(i)
            if bar is not None and result[i] is not None:
                bar.update(1)
        queue.extendleft(reversed(back))  # running rows first: the stragglers do not pile up at the end
    if bar is not None:
        bar.close()
    return result  # type: ignore[return-value]
