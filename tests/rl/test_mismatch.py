"""Rollout-train mismatch and truncated importance sampling (qerl/rl/mismatch.py, the `token_weights` of the loss).

Run: `pytest tests/rl/test_mismatch.py -q`.
"""
from __future__ import annotations

import math

import pytest
import torch

from qerl.rl.losses import dapo_loss, grpo_loss
from qerl.rl.mismatch import importance_ratios, rollout_mismatch, tis_weights


def _batch(seed=0, n=6, length=5):
    g = torch.Generator().manual_seed(seed)
    logp = -torch.rand(n, length, generator=g) * 3  # [N, L]
    mask = torch.ones(n, length)
    mask[0, 3:] = 0
    mask[4, 1:] = 0
    adv = torch.randn(n, generator=g)
    return logp, mask, adv


def test_weights_are_one_and_the_loss_unchanged_when_the_log_probs_agree():
    logp, mask, adv = _batch()
    w = tis_weights(logp, logp.clone(), mask, cap=2.0)
    assert torch.equal(w, torch.ones_like(w))
    for loss_fn in (grpo_loss, dapo_loss):
        x = logp.clone().requires_grad_(True)
        plain, _ = loss_fn(x, logp, adv, mask)
        weighted, _ = loss_fn(x, logp, adv, mask, token_weights=w)
        assert weighted.item() == plain.item()


def test_weights_clip_at_the_cap_and_follow_the_ratio_below_it():
    logp, mask, _ = _batch()
    sampled = logp.clone()
    sampled[1, 0] = logp[1, 0] - 2.0  # pi_old / mu = e^2 > cap
    sampled[2, 1] = logp[2, 1] + 0.5  # e^-0.5 < 1
    w = tis_weights(logp, sampled, mask, cap=2.0)
    assert w[1, 0].item() == 2.0
    assert w[2, 1].item() == pytest.approx(math.exp(-0.5))
    assert w.max().item() <= 2.0 and w[mask.bool()].min().item() > 0


def test_padding_never_reaches_the_ratio():
    logp, mask, _ = _batch()
    sampled = logp.clone()
    sampled[0, 4] = float("-inf")  # padding may hold anything
    r = importance_ratios(logp, sampled, mask)
    assert torch.isfinite(r).all() and r[0, 4].item() == 1.0


def test_mismatch_is_zero_for_agreement_and_grows_with_the_gap():
    logp, mask, _ = _batch()
    same = rollout_mismatch(logp, logp.clone(), mask)
    assert same == {"mismatch_kl": 0.0, "is_ratio_mean": 1.0, "is_ratio_max": 1.0, "is_ratio_p99": 1.0}
    g = torch.Generator().manual_seed(1)
    small = rollout_mismatch(logp, logp + 0.01 * torch.randn(logp.shape, generator=g), mask)
    large = rollout_mismatch(logp, logp + 0.1 * torch.randn(logp.shape, generator=g), mask)
    assert 0 < small["mismatch_kl"] < large["mismatch_kl"]
    assert large["is_ratio_p99"] <= large["is_ratio_max"]


def test_weighted_gradient_is_the_weighted_sum():
    logp, mask, adv = _batch()
    w = torch.full_like(logp, 0.5)
    x = logp.clone().requires_grad_(True)
    loss, _ = dapo_loss(x, logp, adv, mask, token_weights=w)
    loss.backward()
    y = logp.clone().requires_grad_(True)
    plain, _ = dapo_loss(y, logp, adv, mask)
    plain.backward()
    assert torch.allclose(x.grad, 0.5 * y.grad)


def test_bad_inputs_are_rejected():
    logp, mask, adv = _batch()
    with pytest.raises(ValueError, match="cap must be > 0"):
        tis_weights(logp, logp, mask, cap=0.0)
    with pytest.raises(ValueError, match="same shape"):
        importance_ratios(logp, logp[:, :2], mask)
    with pytest.raises(ValueError, match="token_weights has shape"):
        grpo_loss(logp, logp, adv, mask, token_weights=torch.ones(2, 2))
