"""train.tasks.<t>.reward: coin, the reward of timing runs on random weights (config/paper_random.yaml).

A random-weight model never answers right, so with the paper's grader every advantage is 0 and every update skips
its backward (the zero-signal path): the backward would never be timed. The coin gives each completion a seeded 0/1
reward that ignores the text: drawn from (seed, step, rank) alone (a resumed run draws the same), groups get mixed
rewards, and the update runs its backward.
Run: `python -m pytest -q tests/rl/test_coin_reward.py`."""
from __future__ import annotations

import copy

import pytest
import torch

from qerl.config import validate_config
from qerl.rl import step as S
from qerl.rl.rewards import coin_rewards
from qerl.rl.settings import build_run_policy, resolve_settings

CFG = {"prompt": {"instruction": "none"},
       "train": {"steps": 2, "lr": 1e-2, "lr_by_method": {}, "lora": {"rank": 4, "alpha": 8},
                 "tasks": {"t": {"source": "tiny", "algorithm": "grpo", "group_size": 4, "updates_per_rollout": 2,
                                 "max_new_tokens": 4}}}}


def test_coin_rewards_are_seeded_by_seed_step_and_rank():
    golds = ["1"] * 64
    draw = lambda *key: [r.reward for r in coin_rewards(*key)(["x"] * 64, golds)]  # noqa: E731
    first = draw(3, 5, 0)
    assert first == draw(3, 5, 0)  # the same key draws the same (a resumed step)
    assert set(first) == {0.0, 1.0}
    assert first != draw(3, 6, 0) and first != draw(3, 5, 1) and first != draw(4, 5, 0)
    assert first == [r.reward for r in coin_rewards(3, 5, 0)(["other text"] * 64, ["2"] * 64)]  # ignores the texts
    assert not any(r.correct or r.formatted for r in coin_rewards(3, 5, 0)(["x"] * 64, golds))  # nothing graded
    with pytest.raises(ValueError, match="64 completions but 63 gold"):
        coin_rewards(0, 0)(["x"] * 64, golds[:63])


def _step(base, reward: str) -> tuple:
    cfg = copy.deepcopy(CFG)
    cfg["train"]["tasks"]["t"]["reward"] = reward
    s = resolve_settings(validate_config(cfg), "t", "lora", "default", seed=0)
    torch.manual_seed(0)
    learner = S.make_learner(build_run_policy(s, base), s)
    # gold answers the random model will not write: the grader gives 0 to every completion
    row = S.rl_step(learner, S.StepBatch(0, ["Ann has 3 apples .", "Bob has 5 pears ."], ["123456", "654321"]), s)
    return s, row


def test_coin_makes_the_update_run_its_backward(tiny_base, monkeypatch):
    s, graded = _step(tiny_base, "answer")
    assert s.reward == "answer" and graded.reward == 0.0 and graded.grad_norm == 0.0  # zero signal: no gradient
    calls = []
    real = torch.Tensor.backward
    monkeypatch.setattr(torch.Tensor, "backward", lambda self, *a, **k: (calls.append(1), real(self, *a, **k)))
    s, coin = _step(tiny_base, "coin")
    assert s.reward == "coin" and 0.0 < coin.reward < 1.0 and coin.mixed_groups > 0
    assert coin.accuracy == 0.0  # the coin grades nothing
    assert coin.grad_norm > 0.0 and len(calls) >= 1  # the update ran its backward


def test_reward_key_is_checked():
    cfg = copy.deepcopy(CFG)
    cfg["train"]["tasks"]["t"]["reward"] = "dice"
    with pytest.raises(Exception, match="dice"):
        validate_config(cfg)
