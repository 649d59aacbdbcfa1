"""sequence_logprobs in row chunks (no-grad passes over real vocabularies) equals the one-pass result.
Run: `python -m pytest -q tests/rl/test_logprob_chunks.py`."""
from __future__ import annotations

import torch

import qerl.rl.rollout as rollout


def test_chunked_no_grad_pass_equals_one_pass(tiny_model, monkeypatch):
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, tiny_model.config.vocab_size, (5, 12), generator=g)
    mask = torch.ones_like(ids)
    mask[1, :3] = 0  # a left-padded prompt
    with torch.no_grad():
        whole, ent = rollout.sequence_logprobs(tiny_model, ids, mask, 4, with_entropy=True)
        monkeypatch.setattr(rollout, "LOGITS_BUDGET", 2 * 8 * tiny_model.config.vocab_size)  # 2 rows a chunk
        parts, ent_parts = rollout.sequence_logprobs(tiny_model, ids, mask, 4, with_entropy=True)
    torch.testing.assert_close(parts, whole, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(ent_parts, ent, rtol=1e-5, atol=1e-6)
    logp, _ = rollout.sequence_logprobs(tiny_model, ids, mask, 4)  # with grad: one pass, grads flow
    assert logp.requires_grad and logp.shape == (5, 8)


def test_chunked_update_pass_equals_one_pass_with_gradients(tiny_model, monkeypatch):
    """The update's pass (grad enabled) in checkpointed row chunks: same log-probs, same gradients."""
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, tiny_model.config.vocab_size, (4, 10), generator=g)
    mask = torch.ones_like(ids)
    mask[2, :2] = 0

    def grads(budget):
        monkeypatch.setattr(rollout, "LOGITS_BUDGET", budget)
        tiny_model.zero_grad(set_to_none=True)
        logp, _ = rollout.sequence_logprobs(tiny_model, ids, mask, 3)
        (logp * torch.linspace(-1, 1, logp.numel()).view_as(logp)).sum().backward()
        return logp.detach(), {n: p.grad.clone() for n, p in tiny_model.named_parameters() if p.grad is not None}

    whole, g_whole = grads(2**28)
    parts, g_parts = grads(7 * tiny_model.config.vocab_size)  # one row a chunk
    torch.testing.assert_close(parts, whole, rtol=1e-5, atol=1e-6)
    assert g_parts.keys() == g_whole.keys() and len(g_whole) > 0
    for name in g_whole:
        torch.testing.assert_close(g_parts[name], g_whole[name], rtol=1e-4, atol=1e-6)


def test_right_aligned_rows_give_the_left_padded_numbers_and_no_fully_masked_query(tiny_model, monkeypatch):
    """The rolled layout (rollout._right_align, on CUDA by default, forced here on the CPU): the model sees no row
    whose mask starts with padding (a padding query attending to no key, whose attention backward was NaN on the
    GPU), and the log-probs and gradients equal the left-padded pass's, in one pass and in chunks."""
    g = torch.Generator().manual_seed(2)
    ids = torch.randint(3, tiny_model.config.vocab_size, (4, 11), generator=g)
    mask = torch.ones_like(ids)
    mask[0, :3] = 0  # left-padded prompts (prompt length 5)
    mask[2, :1] = 0
    mask[1, 9:] = 0  # a completion that ended early (right padding)
    seen = []
    hook = tiny_model.model.register_forward_pre_hook(lambda m, a, k: seen.append(k["attention_mask"].clone()),
                                                      with_kwargs=True)

    def run(aligned, budget=2**28):
        monkeypatch.setattr(rollout, "_right_align_on", lambda t: aligned)
        monkeypatch.setattr(rollout, "LOGITS_BUDGET", budget)
        tiny_model.zero_grad(set_to_none=True)
        seen.clear()
        logp, _ = rollout.sequence_logprobs(tiny_model, ids, mask, 5)
        (logp * mask[:, 5:] * torch.linspace(-1, 1, logp.numel()).view_as(logp)).sum().backward()
        with torch.no_grad():
            _, ent = rollout.sequence_logprobs(tiny_model, ids, mask, 5, with_entropy=True)
        return logp.detach(), ent, {n: p.grad.clone() for n, p in tiny_model.named_parameters() if p.grad is not None}

    try:
        ref, ref_ent, ref_g = run(False)
        assert any(bool((m[:, 0] == 0).any()) for m in seen)  # the left-padded pass: padding first
        for budget in (2**28, 6 * tiny_model.config.vocab_size):  # one pass; one row a chunk
            logp, ent, grads = run(True, budget)
            assert seen and all(bool((m[:, 0] == 1).all()) for m in seen)
            assert all(bool((m[:, :-1] >= m[:, 1:]).all()) for m in seen)  # ones, then padding only
            valid = mask[:, 5:].bool()
            torch.testing.assert_close(logp[valid], ref[valid], rtol=1e-5, atol=1e-6)
            torch.testing.assert_close(ent[valid], ref_ent[valid], rtol=1e-5, atol=1e-6)
            assert grads.keys() == ref_g.keys()
            for n in ref_g:
                torch.testing.assert_close(grads[n], ref_g[n], rtol=1e-4, atol=1e-6)
    finally:
        hook.remove()


def test_no_grad_pass_over_the_activations_budget_runs_in_row_chunks(tiny_model, monkeypatch):
    """More rows than ACTIVATIONS_BUDGET allows (the 7B's 4k-token old log-probs ran out of memory in one pass): whole
    passes of a few rows each, the one-pass numbers; with grad the pass stays whole (checkpointing bounds it)."""
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(3, tiny_model.config.vocab_size, (5, 12), generator=g)
    mask = torch.ones_like(ids)
    mask[3, :2] = 0
    calls = []
    hook = tiny_model.model.register_forward_pre_hook(lambda m, a, k: calls.append(k["input_ids"].shape[0]),
                                                      with_kwargs=True)
    try:
        with torch.no_grad():
            whole, ent = rollout.sequence_logprobs(tiny_model, ids, mask, 4, with_entropy=True)
            assert calls == [5]
            calls.clear()
            monkeypatch.setattr(rollout, "ACTIVATIONS_BUDGET", 16 * 12 * tiny_model.config.intermediate_size * 2)
            parts, ent_parts = rollout.sequence_logprobs(tiny_model, ids, mask, 4, with_entropy=True)
        assert calls == [2, 2, 1]
        torch.testing.assert_close(parts, whole, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(ent_parts, ent, rtol=1e-5, atol=1e-6)
        calls.clear()
        logp, _ = rollout.sequence_logprobs(tiny_model, ids, mask, 4)
        assert calls == [5] and logp.requires_grad
    finally:
        hook.remove()
