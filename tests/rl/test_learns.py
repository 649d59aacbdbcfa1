"""RL learns: a short BF16 LoRA GRPO run on the tiny task must raise its reward (a recipe test with frozen values).

Why: every unit test of the loop's pieces can pass while the loop as a whole stops learning (a sign flip, an
advantage that is always zero, a learning rate that never reaches the optimizer, a LoRA that is never trained).
This test trains the tiny scale's real recipe (config/config.yaml's GRPO task and BF16 LoRA settings) from a frozen
base checkpoint (tests/fixtures/tiny_base: the DAG's pretrained tiny model, 100k parameters, 444 kB) for 12 steps
on one CPU thread and checks three things:
  * accuracy (mean reward of 4 samples at T = 1 on 120 fixed problems of levels 1-3, the same draws for both models)
    rises from before to after training by more than 0.08 (measured at this commit: 0.365 -> 0.656);
  * completions grow (the tiny scale's lever: the policy stops answering without working; 12.4 tokens on average
    over the first three steps -> 17.8 over the last three at this commit, 12 prompts a step);
  * the first steps' rewards and losses equal frozen values: a change to sampling, advantages, the loss or the
    optimizer shows up here even when learning survives it.
Only the first steps are frozen: the tiny scale is deterministic on one machine, not across CPU types, and after a
few updates one sampled token that flips on another CPU changes the rest of the trajectory (README, "Determinism").

Run: `pytest tests/rl/test_learns.py -q` (about 20 s).
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from qerl.config import load_config
from qerl.data.benchmarks import load_jsonl_problems
from qerl.data.prompts import build_prompt
from qerl.data.tiny import write_splits
from qerl.policy import build_policy
from qerl.rl.rewards import compute_rewards
from qerl.rl.rollout import sample
from qerl.rl.settings import resolve_settings
from qerl.rl.trainer import train

REPO = Path(__file__).resolve().parents[2]
FIXTURE = REPO / "tests" / "fixtures" / "tiny_base"
STEPS = 12
MARGIN = 0.08  # accuracy on the fixed problems after training minus before (measured: see the module docstring)
# step -> (reward, loss) of the first steps, measured at this commit.
FROZEN = {0: (0.40625, -0.0050627043237909675), 1: (0.3229166567325592, -0.0052022128365933895)}


def _accuracy(model, tokenizer, problems, instruction: str) -> float:
    """Mean reward of 4 samples per problem at T = 1 with a fixed generator (the same draws for both models)."""
    prompts = [build_prompt(p.question, tokenizer, instruction) for p in problems]
    batch = sample(model, tokenizer, prompts, group_size=4, max_new_tokens=80, temperature=1.0,
                   generator=torch.Generator().manual_seed(123))
    results = compute_rewards(batch.texts, [p.answer for p in problems for _ in range(4)])
    return sum(r.reward for r in results) / len(results)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("learns")
    cfg = load_config(REPO / "config" / "config.yaml", check_data=False)
    cfg["results_dir"] = str(root / "results")
    cfg["train"]["steps"] = STEPS
    tiny = cfg["data"]["tiny"]
    write_splits(root / "data", tiny["seed"], 1, 600, 40, [1, 2, 3], tiny["operand_max"], tiny["direct_fraction"])
    problems = load_jsonl_problems(root / "data" / "test.jsonl", "tiny")
    s = resolve_settings(cfg, "tiny_grpo", "lora", "default", 0)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        base = build_policy("bf16", FIXTURE)
        base, tokenizer = base.model, base.tokenizer
        before = _accuracy(base, tokenizer, problems, s.instruction)
        out = train(cfg, s, FIXTURE, root / "run", data_dir=root / "data", progress=False, device="cpu")
        after = _accuracy(out["model"], tokenizer, problems, s.instruction)
    finally:
        torch.set_num_threads(threads)
    rows = [json.loads(line) for line in (root / "run" / "metrics.jsonl").read_text().splitlines()]
    return {"rows": rows, "before": before, "after": after}


def test_accuracy_rises(run):
    assert len(run["rows"]) == STEPS
    gain = run["after"] - run["before"]
    assert gain > MARGIN, f"accuracy {run['before']:.3f} -> {run['after']:.3f} after {STEPS} steps: RL stopped learning"


def test_completions_grow(run):  # the lever: the policy stops answering without working the problem
    lengths = [row["response_length"] for row in run["rows"]]
    assert sum(lengths[-3:]) / 3 > sum(lengths[:3]) / 3 + 1.0


def test_first_steps_match_frozen_values(run):
    for step, (reward, loss) in FROZEN.items():
        row = run["rows"][step]
        assert row["reward"] == pytest.approx(reward, abs=1e-9), f"step {step}: sampling or rewards changed"
        assert row["loss"] == pytest.approx(loss, rel=1e-4, abs=1e-7), f"step {step}: the loss changed"
