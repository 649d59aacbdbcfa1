"""Rollout-train mismatch: how far the policy that sampled the tokens is from the policy the update trains, and
truncated importance sampling (TIS) to correct for it.

Why: the update's "old" log-probs are the clean training policy's, teacher-forced, while the tokens were drawn by
the sampler: with AQN the sampler ran on noisy RMSNorm weights (Alg. 1 line 9), and even without noise the sampler's
KV-cached, possibly fused or CUDA-graph forward differs from the teacher-forced one in float rounding. Every QeRL
step is therefore slightly off-policy. Quantized rollouts in other RL systems are corrected with truncated
importance sampling (each token's loss weighted by min(pi_old / pi_sampler, C)); nobody reports how large the
mismatch is for QeRL. These functions measure it every step (metrics.jsonl) and give the `tis<C>` variant its
weights.

Definitions, per valid completion token t of a row (mu = the sampling distribution, as the sampler reported its
log-prob of the token; pi = the training policy before the update):
    ratio_t = exp(log pi(y_t) - log mu(y_t))
    mismatch_kl = mean over tokens of k3 = ratio - 1 - log(ratio)   (>= 0; its expectation under mu is KL(mu || pi))
    is_ratio_mean / is_ratio_max / is_ratio_p99: mean, max and 99th percentile of ratio_t
    TIS weight_t = min(ratio_t, C), detached (a weight on the token's loss, not a path for gradients).
Run the tests: `pytest tests/rl/test_mismatch.py -q`.
"""
from __future__ import annotations

import math

import torch

__all__ = ["MISMATCH_KEYS", "importance_ratios", "mismatch_stats", "rollout_mismatch", "tis_weights"]

MISMATCH_KEYS = ("mismatch_kl", "is_ratio_mean", "is_ratio_max", "is_ratio_p99")


def importance_ratios(old_logp: torch.Tensor, sample_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Per-token pi_old / mu on valid tokens, 1 elsewhere (no exp of padding).

    Args:
        old_logp: [N, L] training-policy log-probs of the sampled tokens (before the update).
        sample_logp: [N, L] the sampler's log-probs of the same tokens.
        mask: [N, L] 1 (or True) on valid completion tokens.

    Returns:
        [N, L] float32 ratios.

    Raises:
        ValueError: on mismatched shapes.
    """
    if old_logp.shape != sample_logp.shape or old_logp.shape != mask.shape:
        raise ValueError(f"old_logp {tuple(old_logp.shape)}, sample_logp {tuple(sample_logp.shape)} and mask "
                         f"{tuple(mask.shape)} must have the same shape [N, L]")
    valid = mask.bool()
    delta = old_logp.detach().float() - sample_logp.detach().float().to(old_logp.device)  # [N, L]
    return torch.exp(torch.where(valid, delta, torch.zeros_like(delta)))  # [N, L]


def rollout_mismatch(old_logp: torch.Tensor, sample_logp: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """The step's mismatch diagnostics over its valid tokens (module docstring); NaN when no token is valid.

    Args and Raises: as `importance_ratios`.

    Returns:
        {"mismatch_kl", "is_ratio_mean", "is_ratio_max", "is_ratio_p99"} as floats.
    """
    return mismatch_stats(importance_ratios(old_logp, sample_logp, mask)[mask.bool()])


def mismatch_stats(ratios: torch.Tensor) -> dict[str, float]:
    """The mismatch diagnostics of the valid tokens' ratios pi_old / mu ([T], any order; float64 math); NaN for T = 0.

    The training step gathers its ranks' ratios and calls this (qerl.rl.step), so the logged metrics and
    `rollout_mismatch` are one computation.
    """
    r = ratios.double()  # [T]
    if r.numel() == 0:
        return {k: math.nan for k in MISMATCH_KEYS}
    k3 = r - 1.0 - torch.log(r)  # [T]
    return {"mismatch_kl": float(k3.mean()), "is_ratio_mean": float(r.mean()), "is_ratio_max": float(r.max()),
            "is_ratio_p99": float(torch.quantile(r, 0.99))}


def tis_weights(old_logp: torch.Tensor, sample_logp: torch.Tensor, mask: torch.Tensor, cap: float) -> torch.Tensor:
    """Truncated importance weights min(pi_old / mu, cap) per token, detached; 1 where the two log-probs agree.

    Args:
        old_logp, sample_logp, mask: as `importance_ratios`.
        cap: C > 0, the truncation.

    Returns:
        [N, L] weights (0 < w <= cap on valid tokens).

    Raises:
        ValueError: cap <= 0, or mismatched shapes.
    """
    if not cap > 0:
        raise ValueError(f"the TIS cap must be > 0, got {cap!r}")
    return importance_ratios(old_logp, sample_logp, mask).clamp(max=cap)
