"""GRPO and DAPO policy losses, group advantages, dynamic sampling and overlong filtering.

Why: QeRL trains with GRPO (GSM8K, Table 1) and DAPO (BigMath, Table 2) (sec. 3, Eq. 3-4, Table 4). The losses are
plain tensor functions (plus two tiny `nn.Module` wrappers) so the trainer loop stays flat and every line can be
checked against the equations; tests/rl/test_losses.py checks them against TRL's GRPOTrainer to 1e-6.
Run the tests: `pytest tests/rl/test_losses.py -q`.

Shapes: N = B*G completions (B prompts x G samples, grouped contiguously), L = padded completion length.
    logp, old_logp, ref_logp, entropy, mask: [N, L]; advantages, rewards: [N].

Objective (per token, r = exp(logp - old_logp), A = advantage of the token's completion):
    l = -min(r * A, clip(r, 1 - eps_low, 1 + eps_high) * A) + beta * KL_k3,
    KL_k3 = exp(ref_logp - logp) - (ref_logp - logp) - 1   (Schulman's k3 estimator, >= 0, unbiased).
Aggregation:
    "sequence" (GRPO paper): mean over each completion's tokens, then mean over completions;
    "token" (DAPO): sum over every valid token of the batch / number of valid tokens;
    "fixed" (Dr. GRPO): sum over every valid token / (N * max_len).
GRPO = eps 0.2/0.2, "sequence", optional KL (beta); DAPO = eps 0.2/0.28 (clip-higher), "token", no KL.

Deviations and choices (documented):
- Advantages use the unbiased group std (torch's default, as TRL) and A = (r - mean) / (std + eps), eps = 1e-4;
  the paper writes (r - mean) / std, which divides by zero for all-equal groups.
- "sequence" aggregation averages over completions that have at least one valid token (TRL averages over all N,
  counting fully masked rows as zeros); identical when no row is fully masked, and it keeps the GRPO average over
  the completions that are actually trained on after overlong filtering.
- Masked positions are excluded with `torch.where` before the exponential, so padding holding -inf or NaN cannot
  poison the loss or its gradient.
- DAPO's soft overlong punishment (a reward-shaping term) is not implemented; overlong *filtering* is.
- Table 4 says no KL and no entropy loss for the paper's runs: beta defaults to 0 for both losses.
"""
from __future__ import annotations

import math

import torch
from torch import nn

__all__ = [
    "group_advantages",
    "dynamic_sampling_mask",
    "overlong_filter",
    "k3_kl",
    "policy_loss",
    "grpo_loss",
    "dapo_loss",
    "GRPOLoss",
    "DAPOLoss",
]

AGGREGATIONS = ("sequence", "token", "fixed")


def _check_groups(rewards: torch.Tensor, group_size: int) -> None:
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be 1-D [B*G], got shape {tuple(rewards.shape)}")
    if group_size < 1 or rewards.numel() % group_size != 0:
        raise ValueError(f"group_size {group_size} does not divide the {rewards.numel()} rewards")


def group_advantages(
    rewards: torch.Tensor, group_size: int, normalize_std: bool = True, eps: float = 1e-4
) -> torch.Tensor:
    """GRPO's group-relative advantage A_i = (r_i - mean_g r) / (std_g r + eps) (Eq. 3).

    Args:
        rewards: [B*G] rewards, the G samples of each prompt contiguous.
        group_size: G.
        normalize_std: divide by the group std (False: Dr. GRPO's mean-centering only).
        eps: added to the std.

    Returns:
        [B*G] float advantages (zero for groups whose rewards are all equal).

    Raises:
        ValueError: if rewards is not 1-D or G does not divide its length.
    """
    _check_groups(rewards, group_size)
    grouped = rewards.float().view(-1, group_size)  # [B, G]
    centered = grouped - grouped.mean(dim=1, keepdim=True)  # [B, G]
    if normalize_std:
        std = grouped.std(dim=1, keepdim=True) if group_size > 1 else torch.zeros_like(centered[:, :1])  # [B, 1]
        centered = centered / (std + eps)  # [B, G]
    return centered.reshape(-1)  # [B*G]


def dynamic_sampling_mask(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """DAPO's dynamic sampling: keep only groups whose rewards are not all equal (they carry zero advantage).

    Args:
        rewards: [B*G] rewards, groups contiguous.
        group_size: G.

    Returns:
        [B*G] bool, True for completions of groups that are kept.

    Raises:
        ValueError: if rewards is not 1-D or G does not divide its length.
    """
    _check_groups(rewards, group_size)
    grouped = rewards.view(-1, group_size)  # [B, G]
    varied = grouped.amax(dim=1) != grouped.amin(dim=1)  # [B]
    return varied.repeat_interleave(group_size)  # [B*G]


def overlong_filter(mask: torch.Tensor, truncated: torch.Tensor) -> torch.Tensor:
    """DAPO's overlong filtering: completions cut at the length limit get no loss (their reward is noise).

    Args:
        mask: [N, L] valid-token mask (bool or float).
        truncated: [N] bool, True where the completion hit the length limit without finishing.

    Returns:
        [N, L] mask of the same dtype with truncated rows zeroed.

    Raises:
        ValueError: on mismatched shapes.
    """
    if mask.dim() != 2 or truncated.shape != mask.shape[:1]:
        raise ValueError(f"mask must be [N, L] and truncated [N]; got {tuple(mask.shape)} and {tuple(truncated.shape)}")
    keep = ~truncated.bool()  # [N]
    return mask * keep.unsqueeze(1).to(mask.dtype)  # [N, L]


def k3_kl(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimate of KL(pi || pi_ref): exp(ref - logp) - (ref - logp) - 1 (>= 0).

    Args:
        logp: [N, L] current-policy log-probs of the sampled tokens.
        ref_logp: [N, L] reference-policy log-probs of the same tokens.

    Returns:
        [N, L] per-token KL estimates.
    """
    delta = ref_logp - logp  # [N, L]
    return torch.exp(delta) - delta - 1.0  # [N, L]


def _masked_mean(x: torch.Tensor, mask: torch.Tensor) -> float:
    count = mask.sum()  # []
    return float((x * mask).sum() / count) if count > 0 else float("nan")


def _check_shapes(logp, old_logp, advantages, mask, ref_logp, entropy) -> None:
    if logp.dim() != 2:
        raise ValueError(f"logp must be [N, L], got shape {tuple(logp.shape)}")
    for name, t in (("old_logp", old_logp), ("mask", mask), ("ref_logp", ref_logp), ("entropy", entropy)):
        if t is not None and t.shape != logp.shape:
            raise ValueError(f"{name} has shape {tuple(t.shape)} but logp has {tuple(logp.shape)}")
    if advantages.shape != logp.shape[:1]:
        raise ValueError(f"advantages must be [N] = [{logp.shape[0]}], got shape {tuple(advantages.shape)}")


def policy_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    eps_low: float = 0.2,
    eps_high: float = 0.2,
    beta: float = 0.0,
    ref_logp: torch.Tensor | None = None,
    aggregation: str = "sequence",
    max_len: int | None = None,
    entropy: torch.Tensor | None = None,
    token_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The clipped-ratio policy loss shared by GRPO and DAPO (see the module docstring for the formulas).

    Args:
        logp: [N, L] log-probs of the sampled tokens under the policy being trained (with grad).
        old_logp: [N, L] log-probs under the rollout policy (detached; equal to logp.detach() on-policy).
        advantages: [N] one advantage per completion.
        mask: [N, L] 1 for completion tokens that count, 0 for padding and filtered completions.
        eps_low, eps_high: clip range [1 - eps_low, 1 + eps_high].
        beta: KL coefficient; > 0 needs ref_logp.
        ref_logp: [N, L] reference-policy log-probs (optional; also gives the "kl" diagnostic when beta = 0).
        aggregation: "sequence", "token" or "fixed".
        max_len: the completion-length budget, for "fixed" aggregation.
        entropy: [N, L] per-token policy entropy, only for the "entropy" diagnostic.
        token_weights: [N, L] detached weights on each token's objective (truncated importance sampling,
            qerl.rl.mismatch.tis_weights); None = 1. The KL term is not weighted.

    Returns:
        (loss, diagnostics): a scalar loss with grad, and detached floats: clip_fraction, clip_low_fraction,
        clip_high_fraction (fractions of valid tokens whose gradient the clip removes), ratio_mean, ratio_min,
        ratio_max, plus kl when ref_logp is given and entropy when entropy is given (NaN when no token is valid).

    Raises:
        ValueError: on mismatched shapes, an unknown aggregation, beta > 0 without ref_logp, "fixed" without
            max_len, or negative clip ranges.
    """
    _check_shapes(logp, old_logp, advantages, mask, ref_logp, entropy)
    if token_weights is not None and token_weights.shape != logp.shape:
        raise ValueError(f"token_weights has shape {tuple(token_weights.shape)} but logp has {tuple(logp.shape)}")
    if aggregation not in AGGREGATIONS:
        raise ValueError(f"aggregation {aggregation!r} is not one of {AGGREGATIONS}")
    if eps_low < 0 or eps_high < 0:
        raise ValueError(f"clip ranges must be >= 0, got eps_low={eps_low}, eps_high={eps_high}")
    if beta != 0.0 and ref_logp is None:
        raise ValueError(f"beta={beta} needs ref_logp (the reference policy's log-probs)")
    if aggregation == "fixed" and (max_len is None or max_len < 1):
        raise ValueError(f"aggregation 'fixed' needs max_len >= 1, got {max_len}")

    valid = mask.bool()  # [N, L]
    weight = valid.to(logp.dtype)  # [N, L]
    adv = advantages.to(logp.dtype).unsqueeze(1)  # [N, 1]
    zeros = torch.zeros_like(logp)  # [N, L]
    logp_v = torch.where(valid, logp, zeros)  # [N, L] padding may hold -inf/NaN: keep it out of values and grads
    old_v = torch.where(valid, old_logp.to(logp.dtype), zeros)  # [N, L]
    log_ratio = logp_v - old_v  # [N, L]
    ratio = torch.exp(log_ratio)  # [N, L]
    clipped = torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high)  # [N, L]
    per_token = -torch.minimum(ratio * adv, clipped * adv)  # [N, L]
    if token_weights is not None:
        per_token = per_token * token_weights.detach().to(logp.dtype)  # [N, L] TIS: min(pi_old / mu, C)
    kl = None
    if ref_logp is not None:
        kl = k3_kl(logp_v, torch.where(valid, ref_logp.to(logp.dtype), zeros))  # [N, L], 0 on padding
        if beta != 0.0:
            per_token = per_token + beta * kl  # [N, L]
    per_token = torch.where(valid, per_token, torch.zeros_like(per_token))  # [N, L]

    if aggregation == "sequence":
        per_seq = per_token.sum(dim=1) / weight.sum(dim=1).clamp(min=1.0)  # [N]
        n_seq = (weight.sum(dim=1) > 0).sum().clamp(min=1)  # []
        loss = per_seq.sum() / n_seq  # []
    elif aggregation == "token":
        loss = per_token.sum() / weight.sum().clamp(min=1.0)  # []
    else:
        loss = per_token.sum() / (logp.shape[0] * max_len)  # []

    with torch.no_grad():
        low = (ratio < 1.0 - eps_low) & (adv < 0)  # [N, L]
        high = (ratio > 1.0 + eps_high) & (adv > 0)  # [N, L]
        r_valid = ratio[valid]  # [T]
        diagnostics = {
            "clip_fraction": _masked_mean((low | high).to(logp.dtype), weight),
            "clip_low_fraction": _masked_mean(low.to(logp.dtype), weight),
            "clip_high_fraction": _masked_mean(high.to(logp.dtype), weight),
            "ratio_mean": float(r_valid.mean()) if r_valid.numel() else math.nan,
            "ratio_min": float(r_valid.min()) if r_valid.numel() else math.nan,
            "ratio_max": float(r_valid.max()) if r_valid.numel() else math.nan,
        }
        if kl is not None:
            diagnostics["kl"] = _masked_mean(kl, weight)
        if entropy is not None:
            diagnostics["entropy"] = _masked_mean(entropy.to(logp.dtype), weight)
    return loss, diagnostics


def grpo_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    ref_logp: torch.Tensor | None = None,
    *,
    beta: float = 0.0,
    eps: float = 0.2,
    entropy: torch.Tensor | None = None,
    token_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """GRPO (Eq. 3-4): symmetric clip eps, sequence-mean-then-batch-mean, optional k3 KL with coefficient beta.

    Args and Returns: as `policy_loss` (eps sets both clip ranges).

    Raises:
        ValueError: as `policy_loss`.
    """
    return policy_loss(logp, old_logp, advantages, mask, eps_low=eps, eps_high=eps, beta=beta, ref_logp=ref_logp,
                       aggregation="sequence", entropy=entropy, token_weights=token_weights)


def dapo_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    eps_low: float = 0.2,
    eps_high: float = 0.28,
    entropy: torch.Tensor | None = None,
    ref_logp: torch.Tensor | None = None,
    token_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """DAPO: clip-higher (eps_low 0.2, eps_high 0.28), token-level mean over all valid tokens of the batch, no KL.

    Apply `dynamic_sampling_mask` and `overlong_filter` to the mask first (DAPO's other two ingredients).
    ref_logp, if given, is used only for the "kl" diagnostic.

    Args and Returns: as `policy_loss`.

    Raises:
        ValueError: as `policy_loss`.
    """
    return policy_loss(logp, old_logp, advantages, mask, eps_low=eps_low, eps_high=eps_high, beta=0.0,
                       ref_logp=ref_logp, aggregation="token", entropy=entropy, token_weights=token_weights)


class GRPOLoss(nn.Module):
    """`grpo_loss` as a module: `loss, diag = GRPOLoss(beta=0.04)(logp, old_logp, adv, mask, ref_logp)`."""

    def __init__(self, eps: float = 0.2, beta: float = 0.0):
        super().__init__()
        self.eps, self.beta = eps, beta

    def forward(self, logp, old_logp, advantages, mask, ref_logp=None, entropy=None):
        return grpo_loss(logp, old_logp, advantages, mask, ref_logp, beta=self.beta, eps=self.eps, entropy=entropy)


class DAPOLoss(nn.Module):
    """`dapo_loss` as a module: `loss, diag = DAPOLoss()(logp, old_logp, adv, mask)`."""

    def __init__(self, eps_low: float = 0.2, eps_high: float = 0.28):
        super().__init__()
        self.eps_low, self.eps_high = eps_low, eps_high

    def forward(self, logp, old_logp, advantages, mask, ref_logp=None, entropy=None):
        return dapo_loss(logp, old_logp, advantages, mask, eps_low=self.eps_low, eps_high=self.eps_high,
                         entropy=entropy, ref_logp=ref_logp)
