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
