"""The rollout engine: KV-cached sampling agrees with teacher-forced log-probs; stops, groups, entropy, seeding."""
from __future__ import annotations

import pytest
import torch

from qerl.data.prompts import build_prompt
from qerl.models.tiny import build_model, build_tokenizer
from qerl.rl.rollout import _shared_prefill, kv_cache_arg, sample, sequence_logprobs


@pytest.fixture(scope="module")
def policy():
    tok = build_tokenizer()
    model = build_model(tok, seed=1)
    prompts = [build_prompt(q, tok, "none") for q in ("Ann has 3 pens . How many pens does Ann have now ?",
                                                       "Ben has 12 cups . Ben eats 5 cups . How many cups does Ben have now ?")]
    return model, tok, prompts


def test_sampler_logprobs_match_teacher_forcing(policy):
    model, tok, prompts = policy
    batch = sample(model, tok, prompts, group_size=3, max_new_tokens=12, temperature=1.0,
                   generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        logp, ent = sequence_logprobs(model, batch.input_ids, batch.attention_mask, batch.prompt_len, with_entropy=True)
    mask = batch.completion_mask[:, batch.prompt_len:].bool()
    assert torch.allclose(logp[mask], batch.sample_logp[mask], atol=1e-4)  # left padding + KV cache = full forward
    assert torch.allclose(ent[mask], batch.entropy[mask], atol=1e-4)
    assert (batch.entropy[~mask] == 0).all()


def test_groups_lengths_and_seeding(policy):
    model, tok, prompts = policy
    a = sample(model, tok, prompts, group_size=4, max_new_tokens=8, generator=torch.Generator().manual_seed(3))
    b = sample(model, tok, prompts, group_size=4, max_new_tokens=8, generator=torch.Generator().manual_seed(3))
    assert a.input_ids.shape[0] == 8 and len(a.texts) == 8
    assert torch.equal(a.input_ids, b.input_ids)
    assert torch.equal(a.lengths, a.completion_mask.sum(1))
    assert ((a.lengths == 8) == a.truncated).all() or a.truncated.sum() <= (a.lengths == 8).sum()


def test_stops_after_answer_tag(policy):
    model, tok, prompts = policy
    stop = tok.convert_tokens_to_ids(["</answer>"])
    # make "</answer>" overwhelmingly likely after the first token: every completion must stop at length 1 or 2
    with torch.no_grad():
        bias = model.lm_head.weight.new_zeros(model.lm_head.weight.shape[0])
        bias[stop[0]] = 50.0
        model.lm_head.bias = torch.nn.Parameter(bias)
    try:
        batch = sample(model, tok, prompts, group_size=2, max_new_tokens=10, generator=torch.Generator().manual_seed(0))
    finally:
        model.lm_head.bias = None
    assert (batch.lengths == 1).all() and not batch.truncated.any()
    assert all(t.strip() == "</answer>" for t in batch.texts)


def test_greedy_and_bad_arguments(policy):
    model, tok, prompts = policy
    g1 = sample(model, tok, prompts, group_size=2, max_new_tokens=6, temperature=0)
    assert torch.equal(g1.input_ids[0], g1.input_ids[1])  # greedy: the group is identical
    with pytest.raises(ValueError, match="top_p"):
        sample(model, tok, prompts, group_size=1, max_new_tokens=4, top_p=0)
    with pytest.raises(ValueError, match="group_size"):
        sample(model, tok, prompts, group_size=0, max_new_tokens=4)
    with pytest.raises(ValueError, match="max_position_embeddings"):
        sample(model, tok, prompts, group_size=1, max_new_tokens=10_000)


def test_finished_rows_leave_the_batch_without_changing_results(policy):
    """Dropping finished rows from the KV cache must not change the other rows' samples."""
    model, tok, prompts = policy
    eos = tok.eos_token_id
    with torch.no_grad():  # EOS likely but not certain: rows finish at different steps
        bias = model.lm_head.weight.new_zeros(model.lm_head.weight.shape[0])
        bias[eos] = 3.0
        model.lm_head.bias = torch.nn.Parameter(bias)
    try:
        batch = sample(model, tok, prompts, group_size=6, max_new_tokens=12, generator=torch.Generator().manual_seed(1))
        logp, _ = sequence_logprobs(model, batch.input_ids, batch.attention_mask, batch.prompt_len)
    finally:
        model.lm_head.bias = None
    assert len(set(batch.lengths.tolist())) > 1
    mask = batch.completion_mask[:, batch.prompt_len:].bool()
    assert torch.allclose(logp[mask], batch.sample_logp[mask], atol=1e-4)


def test_prefill_once_per_distinct_prompt_equals_the_prefill_of_every_row(policy):
    """The eager loop's prompt pass runs once per distinct prompt and is gathered to the rows of its group: the KV
    cache and the logits are bit for bit those of a pass over every row (why the sampled tokens do not change)."""
    model, tok, prompts = policy
    rows = [p for p in prompts for _ in range(3)] + [prompts[0]]  # groups of 3, and a repeat out of its group
    enc = tok(rows, return_tensors="pt", padding=True, padding_side="left", add_special_tokens=False)
    ids, attn = enc["input_ids"], enc["attention_mask"]
    position = attn.cumsum(-1) - 1
    position.masked_fill_(attn == 0, 1)
    arg = kv_cache_arg(model)
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=attn, position_ids=position, use_cache=True)
        row_of = torch.tensor([0, 0, 0, 1, 1, 1, 0])
        first = torch.tensor([0, 3])
        cache, logits = _shared_prefill(model, arg, ids[first], attn[first], row_of)
    assert torch.equal(logits, out.logits[:, -1, :].float())
    full = getattr(out, arg)
    for layer, ref in zip(cache.layers, full.layers):
        assert torch.equal(layer.keys, ref.keys) and torch.equal(layer.values, ref.values)
