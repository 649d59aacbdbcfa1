"""The GRPO step `qerl profile` and the DDP benchmark time is the trainer's own (qerl.rl.step.rl_step), with the
run's settings: checked on the CPU at a 1-layer shape with Qwen2.5-0.5B's vocabulary and 64-wide layers (NARROW;
the GPU numbers come from the same function at the real shapes, which tests/profiling/test_profile_cpu.py checks)."""
from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from qerl.config import load_config
from qerl.profiling.archs import ARCHS, Arch
from qerl.profiling.build import random_base
from qerl.profiling.e2e import RandomPromptTokenizer, RandomRewards, default_task, e2e_timing, profile_settings
from qerl.rl.settings import build_run_policy, lora_spec, make_optimizer

CONFIG = Path(__file__).resolve().parents[2] / "config" / "config.yaml"
# 0.5B's vocabulary, so its EOS odds (the rollout must run to its length), with narrow layers: at 0.5B's widths (896,
# MLP 4864) the two cases took ~13 s, spent on the shapes, not on what the test checks
NARROW = Arch("narrow", hidden=64, intermediate=128, layers=1, heads=4, kv_heads=2, vocab=ARCHS["0.5B"].vocab,
              tied=True)


@pytest.fixture(scope="module")
def cfg():
    return load_config(CONFIG, check_data=False)


def test_settings_are_the_runs_at_the_profile_shape(cfg):
    task = default_task(cfg)
    s = profile_settings(cfg, task, "qerl", rank=32, batch=8, completion=2048)
    assert task == "tiny_grpo" and (s.group_size, s.prompts_per_step, s.max_new_tokens) == (8, 1, 2048)
    run_alpha_per_rank = cfg["train"]["lora"]["alpha"] / cfg["train"]["lora"]["rank"]
    assert s.lora_rank == 32 and s.lora_alpha / s.lora_rank == run_alpha_per_rank  # as the rank<r> variant
    assert (s.updates_per_rollout, s.lr, s.optimizer, s.aqn) == (4, cfg["train"]["lr"], "adamw", True)
    assert lora_spec(s).alpha == 32 * run_alpha_per_rank
    assert isinstance(make_optimizer([torch.nn.Parameter(torch.zeros(1))], s), torch.optim.AdamW)
    with pytest.raises(ValueError, match="no task with algorithm grpo"):
        default_task({"train": {"tasks": {"d": {"algorithm": "dapo"}}}})


def test_profile_fails_first_without_the_grpo_steps_optimizer(tmp_path, monkeypatch):
    """config/paper.yaml's 8-bit AdamW without bitsandbytes: `qerl profile` with GRPO-step batches stops before it
    measures anything (the step builds its optimizer after every rollout), naming both fixes; rollouts alone pass
    that check (and then need a GPU)."""
    import sys

    from qerl.profiling.run import profile
    monkeypatch.setitem(sys.modules, "bitsandbytes", None)  # `import bitsandbytes` raises ImportError
    paper = load_config(CONFIG.parent / "paper.yaml", check_data=False)
    kw = dict(archs=["3B"], methods=["qerl"], ranks=[32], batches=[1], full_batches=[])
    with pytest.raises(ValueError, match="adamw8bit.*--e2e-batches with no values"):
        profile(paper, tmp_path, e2e_batches=[2], **kw)
    assert not list(tmp_path.iterdir())  # nothing written
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="no CUDA device"):
            profile(paper, tmp_path, e2e_batches=[], **kw)


def test_random_rewards_are_seeded_draws():
    a, b = RandomRewards(1), RandomRewards(1)
    first = [r.reward for r in a(["", ""] * 8, ["0"] * 16)]
    assert first == [r.reward for r in b(["", ""] * 8, ["0"] * 16)] and set(first) == {0.0, 1.0}
    assert [r.reward for r in a([""] * 16, ["0"] * 16)] != first  # a new draw per call


@pytest.mark.parametrize("method", ["qerl", "lora"])
def test_e2e_step_times_every_phase_on_cpu(cfg, method, monkeypatch):
    torch.set_num_threads(1)
    s = profile_settings(cfg, "tiny_grpo", method, rank=4, batch=2, completion=3)
    weights = "nvfp4" if method == "qerl" else "bf16"
    monkeypatch.setitem(ARCHS, NARROW.name, NARROW)
    base = random_base(NARROW.name, weights, device="cpu", dtype=torch.float32)
    policy = build_run_policy(s, base, tokenizer=RandomPromptTokenizer(base.config.vocab_size, 8, 151643))
    assert (policy.aqn is not None) == (method == "qerl")
    before = {n: p.detach().clone() for n, p in policy.model.named_parameters() if p.requires_grad}
    out = e2e_timing(policy, s, gcs=(False, True))
    assert set(out) == {False, True}
    for t in out.values():
        assert t["rollout_tokens"] == 2 * 3 and t["peak_bytes"] > 0
        assert all(t[k] > 0 and math.isfinite(t[k]) for k in ("rollout_s", "logprob_s", "update_s"))
        assert t["step_s"] == pytest.approx(t["rollout_s"] + t["logprob_s"] + t["update_s"])
    after = dict(policy.model.named_parameters())
    assert any(not torch.equal(after[n], v) for n, v in before.items())  # the run's optimizer updated the adapter
    assert not policy.model.get_base_model().model.gradient_checkpointing  # switched off again after the timing
