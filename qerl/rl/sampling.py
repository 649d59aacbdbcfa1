"""The sampling distribution shared by the eager rollout loop (qerl.rl.rollout) and the decode engine (qerl.rl.engine).

Why a module of its own: both samplers apply the same temperature and nucleus (top-p) filter and report the same
per-token log-prob and entropy of the distribution they sampled from; keeping that here means neither imports the
other (the engine used to import rollout's private filter while rollout imported the engine: an import cycle).

    logits = top_p_filter(logits / temperature, top_p)
    tok, logp, ent = gumbel_sample(logits, temperature=1.0, top_p=0.9)   # in-graph sampling (torch RNG)
"""
from __future__ import annotations

import torch

__all__ = ["top_p_filter", "gumbel_sample"]


def top_p_filter(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """Mask to -inf every logit outside the smallest prefix (by descending probability) whose mass reaches top_p.

    Args:
        logits: [N, V] float logits (already divided by the temperature).
        top_p: nucleus mass in (0, 1]; 1.0 returns `logits` unchanged.

    Returns:
        [N, V] logits, the dropped ones set to -inf.
    """
    if top_p >= 1.0:
        return logits
    sorted_logits, order = torch.sort(logits, descending=True, dim=-1)  # [N, V]
    probs = torch.softmax(sorted_logits, dim=-1)  # [N, V]
    drop = probs.cumsum(-1) - probs > top_p  # [N, V] keep the smallest prefix whose mass reaches top_p
    sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    return torch.empty_like(logits).scatter_(-1, order, sorted_logits)


def gumbel_sample(logits: torch.Tensor, temperature: float, top_p: float):
    """Sample one token per row with the Gumbel-max trick (torch's default RNG of the logits' device, so the
    draw can live inside a CUDA graph); greedy when temperature <= 0.

    Args:
        logits: [B, V] logits in any float dtype.
        temperature: softmax temperature (<= 0: argmax, entropy 0).
        top_p: nucleus mass (1.0 = off).

    Returns:
        (tokens [B] long, log-prob of each token under the sampling distribution [B] float32,
         entropy of that distribution in nats [B] float32).
    """
    logits = logits.float()
    if temperature <= 0:
        logp = torch.log_softmax(logits, dim=-1)
        tok = logits.argmax(-1)
        return tok, logp.gather(-1, tok[:, None]).squeeze(1), torch.zeros_like(logp[:, 0])
    logits = top_p_filter(logits / temperature, top_p)
    logp = torch.log_softmax(logits, dim=-1)  # [B, V]
    gumbel = -torch.log(-torch.log(torch.rand_like(logp).clamp_(1e-20, 1.0)))
    tok = (logp + gumbel).argmax(-1)
    probs = logp.exp()
    ent = -(probs * logp.masked_fill(probs == 0, 0.0)).sum(-1)
    return tok, logp.gather(-1, tok[:, None]).squeeze(1), ent
