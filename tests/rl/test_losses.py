"""GRPO/DAPO losses: hand-checked properties, and a cross-check against TRL's GRPOTrainer loss to 1e-6.

The TRL check calls `GRPOTrainer._compute_loss` (unbound) on a stand-in `self` that carries only the attributes the
method reads, with a stubbed `_get_per_token_logps_and_entropies` returning our log-probs; nothing of TRL is copied.
Run: `pytest tests/rl/test_losses.py -q`
"""
from __future__ import annotations

import math
from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch

from qerl.rl.losses import (
    DAPOLoss,
    GRPOLoss,
    dapo_loss,
    dynamic_sampling_mask,
    group_advantages,
    grpo_loss,
    k3_kl,
    overlong_filter,
    policy_loss,
)


def _batch(n=8, length=7, seed=0, dtype=torch.float64, spread=0.3):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(n, length, generator=g, dtype=dtype) * 3  # [N, L]
    logp = (old + spread * torch.randn(n, length, generator=g, dtype=dtype)).clamp(max=0.0)  # [N, L]
    ref = (old + 0.2 * torch.randn(n, length, generator=g, dtype=dtype)).clamp(max=0.0)  # [N, L]
    adv = torch.randn(n, generator=g, dtype=dtype)  # [N]
    lengths = torch.randint(1, length + 1, (n,), generator=g)  # [N], every row >= 1 token
    mask = (torch.arange(length).unsqueeze(0) < lengths.unsqueeze(1)).to(dtype)  # [N, L]
    entropy = torch.rand(n, length, generator=g, dtype=dtype)  # [N, L]
    return logp, old, ref, adv, mask, entropy


# ---------------------------------------------------------------- advantages, dynamic sampling, overlong filtering
def test_group_advantages_by_hand():
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0])  # [B*G], B=2, G=4
    adv = group_advantages(rewards, 4)
    std = torch.tensor([1.0, 0.0, 0.0, 1.0]).std()  # unbiased
    assert torch.allclose(adv[:4], (torch.tensor([1.0, 0.0, 0.0, 1.0]) - 0.5) / (std + 1e-4))
    assert torch.equal(adv[4:], torch.zeros(4))  # all-equal group: zero advantage, no division by zero
    assert torch.allclose(group_advantages(rewards, 4, normalize_std=False)[:4], torch.tensor([0.5, -0.5, -0.5, 0.5]))
    with pytest.raises(ValueError, match="group_size 3 does not divide"):
        group_advantages(rewards, 3)
    with pytest.raises(ValueError, match="1-D"):
        group_advantages(rewards.view(2, 4), 4)


def test_group_advantages_match_trl_formula():
    trl_utils = pytest.importorskip("trl.trainer.utils")
    rewards = torch.rand(24, generator=torch.Generator().manual_seed(1))
    grouped = rewards.view(-1, 8)
    expected = (grouped - grouped.mean(1, keepdim=True)) / (trl_utils.nanstd(grouped, dim=1).unsqueeze(1) + 1e-4)
    assert torch.allclose(group_advantages(rewards, 8), expected.reshape(-1), atol=1e-6)


def test_dynamic_sampling_mask_drops_uniform_groups():
    rewards = torch.tensor([1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.5, 0.0, 1.0])
    keep = dynamic_sampling_mask(rewards, 3)
    assert keep.tolist() == [False] * 3 + [False] * 3 + [True] * 3


def test_overlong_filter_zeroes_truncated_rows():
    mask = torch.ones(3, 4)
    out = overlong_filter(mask, torch.tensor([False, True, False]))
    assert out.tolist() == [[1] * 4, [0] * 4, [1] * 4] and out.dtype == mask.dtype
    with pytest.raises(ValueError, match="truncated"):
        overlong_filter(mask, torch.tensor([True]))


# ---------------------------------------------------------------------------------------- loss properties
def test_k3_kl_is_nonnegative_and_zero_at_equality():
    logp, _, ref, *_ = _batch()
    assert (k3_kl(logp, ref) >= 0).all()
    assert torch.equal(k3_kl(logp, logp), torch.zeros_like(logp))


@pytest.mark.parametrize("aggregation", ["sequence", "token", "fixed"])
def test_on_policy_value_and_gradient(aggregation):
    """With old = logp, ratio = 1 everywhere: the loss value is -(aggregated advantage), the gradient is the
    policy gradient -A * weight, and nothing is clipped."""
    logp, _, _, adv, mask, _ = _batch()
    logp = logp.clone().requires_grad_(True)
    loss, diag = policy_loss(logp, logp.detach(), adv, mask, aggregation=aggregation, max_len=7)
    loss.backward()
    counts = mask.sum(1)  # [N]
    if aggregation == "sequence":
        weight = mask / counts.unsqueeze(1) / mask.shape[0]
    elif aggregation == "token":
        weight = mask / mask.sum()
    else:
        weight = mask / (mask.shape[0] * 7)
    assert torch.allclose(logp.grad, -adv.unsqueeze(1) * weight)
    assert torch.allclose(loss, -(adv.unsqueeze(1) * weight).sum())
    assert diag["clip_fraction"] == 0.0 and diag["ratio_min"] == diag["ratio_max"] == 1.0


def test_clip_removes_gradient_outside_trust_region():
    old = torch.zeros(2, 1, dtype=torch.float64)
    logp = torch.log(torch.tensor([[1.5], [0.5]], dtype=torch.float64)).requires_grad_(True)  # ratios 1.5, 0.5
    mask = torch.ones(2, 1)
    loss, diag = dapo_loss(logp, old, torch.tensor([1.0, -1.0], dtype=torch.float64), mask)
    loss.backward()
    assert torch.equal(logp.grad, torch.zeros_like(logp))  # both clipped: high side for A>0, low side for A<0
    assert diag["clip_high_fraction"] == 0.5 and diag["clip_low_fraction"] == 0.5 and diag["clip_fraction"] == 1.0
    # clip-higher: ratio 1.25 is inside DAPO's [0.8, 1.28] but outside GRPO's [0.8, 1.2]
    logp = torch.log(torch.tensor([[1.25]], dtype=torch.float64)).requires_grad_(True)
    assert dapo_loss(logp, old[:1], torch.tensor([1.0], dtype=torch.float64), mask[:1])[1]["clip_fraction"] == 0.0
    assert grpo_loss(logp, old[:1], torch.tensor([1.0], dtype=torch.float64), mask[:1])[1]["clip_fraction"] == 1.0


def test_padding_with_nan_and_inf_does_not_poison_loss_or_grad():
    logp, old, ref, adv, mask, _ = _batch()
    bad = logp.clone()
    bad[mask == 0] = float("nan")
    old_bad = old.clone()
    old_bad[mask == 0] = -float("inf")
    ref_bad = ref.clone()
    ref_bad[mask == 0] = float("nan")
    a = bad.clone().requires_grad_(True)
    b = logp.clone().requires_grad_(True)
    loss_a, _ = grpo_loss(a, old_bad, adv, mask, ref_bad, beta=0.1)
    loss_b, _ = grpo_loss(b, old, adv, mask, ref, beta=0.1)
    loss_a.backward()
    loss_b.backward()
    assert torch.isfinite(loss_a) and torch.allclose(loss_a, loss_b)
    assert torch.isfinite(a.grad).all() and torch.allclose(a.grad, b.grad)


def test_fully_masked_batch_gives_zero_loss_and_nan_diagnostics():
    logp, old, _, adv, mask, _ = _batch()
    logp.requires_grad_(True)
    for fn in (grpo_loss, dapo_loss):
        loss, diag = fn(logp, old, adv, torch.zeros_like(mask))
        loss.backward()
        assert loss.item() == 0.0 and math.isnan(diag["ratio_mean"]) and math.isnan(diag["clip_fraction"])


def test_sequence_mean_skips_filtered_rows():
    """A completion removed by overlong filtering does not dilute the GRPO batch mean."""
    logp, old, _, adv, mask, _ = _batch()
    truncated = torch.zeros(8, dtype=torch.bool)
    truncated[0] = True
    full, _ = grpo_loss(logp[1:], old[1:], adv[1:], mask[1:])
    filtered, _ = grpo_loss(logp, old, adv, overlong_filter(mask, truncated))
    assert torch.allclose(full, filtered)


def test_modules_match_functions_and_diagnostics_are_floats():
    logp, old, ref, adv, mask, ent = _batch()
    l1, d1 = GRPOLoss(beta=0.04)(logp, old, adv, mask, ref, ent)
    l2, d2 = grpo_loss(logp, old, adv, mask, ref, beta=0.04, entropy=ent)
    assert torch.equal(l1, l2) and d1 == d2
    assert set(d1) == {"clip_fraction", "clip_low_fraction", "clip_high_fraction", "ratio_mean", "ratio_min",
                       "ratio_max", "kl", "entropy"}
    assert all(type(v) is float for v in d1.values())
    l3, d3 = DAPOLoss()(logp, old, adv, mask)
    assert torch.equal(l3, dapo_loss(logp, old, adv, mask)[0]) and "kl" not in d3


def test_bad_arguments_raise_value_error():
    logp, old, ref, adv, mask, _ = _batch()
    with pytest.raises(ValueError, match="old_logp has shape"):
        grpo_loss(logp, old[:, :3], adv, mask)
    with pytest.raises(ValueError, match="advantages must be"):
        grpo_loss(logp, old, adv[:3], mask)
    with pytest.raises(ValueError, match="needs ref_logp"):
        grpo_loss(logp, old, adv, mask, beta=0.1)
    with pytest.raises(ValueError, match="aggregation 'bogus'"):
        policy_loss(logp, old, adv, mask, aggregation="bogus")
    with pytest.raises(ValueError, match="needs max_len"):
        policy_loss(logp, old, adv, mask, aggregation="fixed")


# ------------------------------------------------------------------------------------ TRL cross-check
class _Accelerator:
    """Single-process stand-in for accelerate.Accelerator: collectives are identities."""

    num_processes = 1
    sync_gradients = True

    def reduce(self, tensor, reduction="sum"):
        return tensor

    def gather(self, tensor):
        return tensor

    gather_for_metrics = gather


def _trl_loss(loss_type, logp, old, adv, mask, entropy, ref=None, beta=0.0, eps_low=0.2, eps_high=0.2, max_len=None):
    """TRL's GRPOTrainer._compute_loss on a stand-in self: one process, no accumulation, token-level ratios."""
    grpo_trainer = pytest.importorskip("trl.trainer.grpo_trainer")
    n, length = logp.shape
    stand_in = SimpleNamespace(
        loss_type=loss_type,
        epsilon_low=eps_low,
        epsilon_high=eps_high,
        beta=beta,
        top_entropy_quantile=1.0,
        off_policy_mask_threshold=None,
        importance_sampling_level="token",
        use_vllm=False,
        vllm_importance_sampling_correction=False,
        model=SimpleNamespace(training=False),
        current_gradient_accumulation_steps=1,
        max_completion_length=max_len or length,
        accelerator=_Accelerator(),
        _entropy_bonus_enabled=False,
        aux_loss_enabled=False,
        _metrics={"train": defaultdict(list), "eval": defaultdict(list)},
        args=SimpleNamespace(use_bias_correction_kl=False, delta=None, steps_per_generation=1),
        _get_per_token_logps_and_entropies=lambda *args, **kwargs: (logp, entropy, None),
    )
    inputs = {
        "prompt_ids": torch.zeros(n, 1, dtype=torch.long),
        "prompt_mask": torch.ones(n, 1, dtype=torch.long),
        "completion_ids": torch.zeros(n, length, dtype=torch.long),
        "completion_mask": mask,
        "advantages": adv,
        "old_per_token_logps": old,
        "ref_per_token_logps": ref,
        "num_items_in_batch": mask.sum(),
    }
    loss = grpo_trainer.GRPOTrainer._compute_loss(stand_in, None, inputs)
    return loss, {k: v[-1] for k, v in stand_in._metrics["eval"].items()}


CASES = {
    # id: (TRL loss_type, TRL kwargs, our function)
    "grpo": ("grpo", {}, lambda lp, o, a, m, r, e: grpo_loss(lp, o, a, m, entropy=e)),
    "grpo-kl": ("grpo", {"beta": 0.04}, lambda lp, o, a, m, r, e: grpo_loss(lp, o, a, m, r, beta=0.04, entropy=e)),
    "dapo": ("dapo", {"eps_high": 0.28}, lambda lp, o, a, m, r, e: dapo_loss(lp, o, a, m, entropy=e)),
    "bnpo": ("bnpo", {}, lambda lp, o, a, m, r, e: policy_loss(lp, o, a, m, aggregation="token", entropy=e)),
    "dr_grpo": ("dr_grpo", {"max_len": 9},
                lambda lp, o, a, m, r, e: policy_loss(lp, o, a, m, aggregation="fixed", max_len=9, entropy=e)),
}


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["fp64", "fp32"])
@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_matches_trl(case, dtype):
    loss_type, kwargs, ours = CASES[case]
    logp, old, ref, adv, mask, entropy = _batch(n=12, length=9, seed=3, dtype=dtype, spread=0.4)
    ref = ref if "beta" in kwargs else None
    a = logp.clone().requires_grad_(True)
    b = logp.clone().requires_grad_(True)
    trl_loss, metrics = _trl_loss(loss_type, a, old, adv, mask, entropy, ref=ref, **kwargs)
    our_loss, diag = ours(b, old, adv, mask, ref, entropy)
    trl_loss.backward()
    our_loss.backward()
    assert abs(trl_loss.item() - our_loss.item()) < 1e-6
    assert torch.allclose(a.grad, b.grad, atol=1e-6, rtol=0)
    assert 0.0 < diag["clip_fraction"] < 1.0  # the batch does exercise the clip
    assert diag["clip_low_fraction"] == pytest.approx(metrics["clip_ratio/low_mean"], abs=1e-6)
    assert diag["clip_high_fraction"] == pytest.approx(metrics["clip_ratio/high_mean"], abs=1e-6)
    assert diag["clip_fraction"] == pytest.approx(metrics["clip_ratio/region_mean"], abs=1e-6)
    assert diag["entropy"] == pytest.approx(metrics["entropy"], abs=1e-6)
    if ref is not None:
        assert diag["kl"] == pytest.approx(metrics["kl"], abs=1e-6)
