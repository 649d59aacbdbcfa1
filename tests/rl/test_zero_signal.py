"""A minibatch whose advantages are all 0 (every group's rewards equal, no KL term) has loss 0 and gradient 0: the
update skips its backward (on an H100 in bfloat16 that backward gave NaN gradients in every LoRA weight) and still
takes the optimizer step on zero gradients, exactly as the backward path does on the CPU.
Run: `python -m pytest -q tests/rl/test_zero_signal.py`."""
from __future__ import annotations

import copy

import torch

from qerl.config import validate_config
from qerl.rl import step as S
from qerl.rl.settings import build_run_policy, resolve_settings

CFG = {"prompt": {"instruction": "none"},
       "train": {"steps": 2, "lr": 1e-2, "lr_by_method": {}, "weight_decay": 0.1, "lora": {"rank": 4, "alpha": 8},
                 "tasks": {"t": {"source": "tiny", "algorithm": "grpo", "group_size": 2, "updates_per_rollout": 2,
                                 "max_new_tokens": 4}}}}


def _learner(base):
    cfg = validate_config(copy.deepcopy(CFG))
    s = resolve_settings(cfg, "t", "lora", "default", seed=0)
    torch.manual_seed(0)
    learner = S.make_learner(build_run_policy(s, base), s)
    # a first update with signal, so AdamW has momentum and a zero-gradient step moves the weights
    ids = torch.randint(3, learner.model.config.vocab_size, (4, 7), generator=torch.Generator().manual_seed(0))
    attn, mask = torch.ones_like(ids), torch.ones(4, 4)
    S.policy_update(learner, s, S.UpdateBatch(ids, attn, 3, mask, torch.tensor([1.0, -1.0, 0.5, -0.5]), None, None),
                    step=0)
    return learner, s, ids, attn, mask


def test_zero_advantage_steps_without_backward(tiny_base, monkeypatch):
    learner, s, ids, attn, mask = _learner(tiny_base)
    reference = copy.deepcopy(learner)
    batch = S.UpdateBatch(ids, attn, 3, mask, torch.zeros(4), None, None)
    # the backward path (what the CPU computes): zero gradients, two optimizer steps
    ref_out = S.policy_update(reference, s, batch, step=1)
    assert ref_out["grad_norms"] == [0.0, 0.0] and ref_out["skipped"] == 0
    before = [p.detach().clone() for p in learner.trainable]

    def no_backward(*a, **k):
        raise AssertionError("a minibatch without signal must not run a backward")

    monkeypatch.setattr(torch.Tensor, "backward", no_backward)
    out = S.policy_update(learner, s, batch, step=1)
    assert out["skipped"] == 0 and out["grad_norms"] == [0.0, 0.0] and out["losses"] == [0.0, 0.0]
    for (n, p), (_, q) in zip(learner.model.named_parameters(), reference.model.named_parameters()):
        if p.requires_grad:
            torch.testing.assert_close(p, q, rtol=0, atol=0, msg=n)  # bit for bit the backward path's weights
    assert any(not torch.equal(p, q) for p, q in zip(learner.trainable, before))  # the optimizer did step
    assert learner.scheduler.last_epoch == reference.scheduler.last_epoch
