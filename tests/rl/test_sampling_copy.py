"""Full fine-tuning samples in the config's dtype: Policy.sampling_model (qerl/policy/core.py).

Full fine-tuning under a 16-bit config keeps float32 master weights (qerl.rl.settings.build_run_policy); its rollouts
and its in-job evaluation sample from one 16-bit copy of them, refreshed in place before each use, as every other
method samples in the config's dtype. Sampling in float32 made the small scale's full fine-tuning roll out 2.6-3.2x
slower than BF16 LoRA on an H100 (run 12: 13.7-16.5 vs 5.2-5.4 s a step). Run: `python -m pytest -q tests/rl/test_sampling_copy.py`."""
from __future__ import annotations

import pytest
import torch

from qerl.config import validate_config
from qerl.rl import step as S
from qerl.rl.settings import build_run_policy, resolve_settings

CFG = {"prompt": {"instruction": "none"},
       "train": {"steps": 2, "lr": 1e-2, "lr_by_method": {}, "lora": {"rank": 4, "alpha": 8},
                 "tasks": {"t": {"source": "tiny", "algorithm": "grpo", "group_size": 2, "updates_per_rollout": 1,
                                 "max_new_tokens": 4}}}}


def _policy(base, method: str, dtype: str):
    s = resolve_settings(validate_config(CFG), "t", method, "default", seed=0)
    return s, build_run_policy(s, base, dtype=dtype)


def test_full_fine_tuning_samples_from_a_refreshed_bfloat16_copy(tiny_base):
    _, policy = _policy(tiny_base, "full", "bfloat16")
    params = list(policy.model.parameters())
    assert {p.dtype for p in params} == {torch.float32}  # the master weights
    sampler = policy.sampling_model()
    mine = list(sampler.parameters())
    assert sampler is not policy.model and {p.dtype for p in mine} == {torch.bfloat16}
    assert len(mine) == len(params) and not any(p.requires_grad for p in mine)
    assert sampler.lm_head.weight is sampler.model.embed_tokens.weight  # the tiny model's tied weights stay tied
    assert all(torch.equal(m, p.to(torch.bfloat16)) for m, p in zip(mine, params))
    assert {b.dtype for b in sampler.buffers()} == {b.dtype for b in policy.model.buffers()}  # rotary stays float32
    ptrs = [m.data_ptr() for m in mine]
    with torch.no_grad():  # an optimizer step changes the master weights in place
        for p in params:
            p.add_(0.25)
    again = policy.sampling_model()
    assert again is sampler and [m.data_ptr() for m in again.parameters()] == ptrs  # engines and graphs stay valid
    assert all(torch.equal(m, p.to(torch.bfloat16)) for m, p in zip(again.parameters(), params))
    ids = torch.tensor([[5, 6, 7, 8]])
    with torch.no_grad():
        want = policy.model(ids).logits
        got = sampler(ids).logits.float()
    assert got.shape == want.shape and (got - want).abs().max() < 0.1 * want.abs().max()


@pytest.mark.parametrize("method,dtype", [("lora", "bfloat16"), ("full", "float32"), ("qerl", "bfloat16")])
def test_other_policies_sample_from_their_own_model(tiny_base, method, dtype):
    _, policy = _policy(tiny_base, method, dtype)
    assert policy.sampling_model() is policy.model


def test_per_forward_noise_samples_from_the_model_its_hooks_are_on(tiny_base):
    from types import SimpleNamespace

    _, policy = _policy(tiny_base, "full", "bfloat16")
    policy.aqn = SimpleNamespace(resample="forward")  # AQN redrawn by forward hooks on the model's own norms
    assert policy.eager_rollout and policy.sampling_model() is policy.model


def test_the_rollout_samples_from_the_copy(tiny_base, monkeypatch):
    s, policy = _policy(tiny_base, "full", "bfloat16")
    learner = S.make_learner(policy, s)
    seen = []
    real = S.sample
    monkeypatch.setattr(S, "sample", lambda model, *a, **k: (seen.append(next(model.parameters()).dtype),
                                                              real(model, *a, **k))[1])
    S.rl_step(learner, S.StepBatch(0, ["Ann has 3 apples ."], ["3"]), s)
    assert seen == [torch.bfloat16]
    assert next(policy.model.parameters()).dtype == torch.float32  # the update still trains the float32 weights


def test_the_in_job_evaluation_samples_from_the_copy(tiny_base, tmp_path, monkeypatch):
    import argparse
    import json

    import qerl.commands.train as T
    import qerl.rl.trainer as trainer
    from qerl.rl.distributed import DistContext

    s, policy = _policy(tiny_base, "full", "bfloat16")
    monkeypatch.setattr(trainer, "train", lambda *a, **k: {"steps": 0, "final": {}, "policy": policy,
                                                          "model": policy.model, "tokenizer": policy.tokenizer,
                                                          "seconds": {}})
    seen = []

    def evaluate(cfg, s, model, *a, **k):
        seen.append(next(model.parameters()).dtype)
        return {"benchmarks": {}}

    monkeypatch.setattr(T, "evaluate_trained", evaluate)
    (tmp_path / "config.yaml").write_text("scale: tiny\n")  # what the provenance records
    args = argparse.Namespace(data=None, device="cpu", base=str(tiny_base), quantized=None, no_progress=True,
                              config=str(tmp_path / "config.yaml"))
    T._train_and_evaluate(args, validate_config(CFG), s, str(tmp_path), DistContext())
    assert seen == [torch.bfloat16]
    assert json.loads((tmp_path / "eval.json").read_text())["train"]["steps"] == 0
