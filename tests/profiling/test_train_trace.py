"""qerl.profiling.train_trace's phase split: each kernel belongs to the phase whose window (its range's start to the
next phase's) holds its start; the profiler's own GPU-side copies of the ranges are not kernels.
Run: `python -m pytest -q tests/profiling/test_train_trace.py`."""
from __future__ import annotations

from types import SimpleNamespace

import torch

from qerl.profiling.train_trace import _merged_us, phase_summary

CPU, CUDA = torch.autograd.DeviceType.CPU, torch.autograd.DeviceType.CUDA


def _ev(name, start, end, device=CUDA):
    return SimpleNamespace(name=name, device_type=device, time_range=SimpleNamespace(start=start, end=end))


def test_merged_intervals():
    assert _merged_us([(0, 10), (5, 15), (20, 30)]) == 25
    assert _merged_us([]) == 0


def test_kernels_split_by_phase_windows():
    events = [_ev("rl_step.rollout", 0, 100, CPU), _ev("rl_step.logprobs", 200, 250, CPU),
              _ev("rl_step.update", 300, 400, CPU),
              _ev("rl_step.rollout", 1, 99),  # the profiler's GPU-side range: not a kernel
              _ev("decode", 10, 20), _ev("decode", 15, 40), _ev("head", 150, 160),  # 150: queued past the range
              _ev("gemm", 210, 230), _ev("gemm", 310, 330), _ev("adam", 390, 450)]
    out = phase_summary(events)
    assert out["rollout"]["kernels"] == 3 and out["rollout"]["kernel_ms"] == round(45 / 1e3, 2)
    assert out["rollout"]["busy_ms"] == round(40 / 1e3, 2)
    assert out["logprobs"]["kernels"] == 1 and out["update"]["kernels"] == 2
    assert out["update"]["wall_ms"] == round(150 / 1e3, 2)  # to the last kernel's end
    assert [t[0] for t in out["rollout"]["top"]] == ["decode", "head"]


def test_finite_watch_names_the_first_non_finite_gradient_of_each_step(tiny_model):
    """--check-finite's backward records: a NaN made in the loss reaches the model's last module first (seq 1 of the
    step's backward), and each step counts its own order; finite gradients leave no record."""
    from qerl.profiling.train_trace import _FiniteWatch

    watch = _FiniteWatch(tiny_model).install()
    try:
        ids = torch.randint(3, tiny_model.config.vocab_size, (2, 6), generator=torch.Generator().manual_seed(0))
        for step, poison in ((0, False), (1, True), (2, True)):
            watch.step = step
            logits = tiny_model(input_ids=ids).logits
            (logits.sum() * (float("nan") if poison else 1.0)).backward()
            tiny_model.zero_grad(set_to_none=True)
    finally:
        watch.remove()
    back = [r for r in watch.records if r["kind"] == "backward"]
    assert [r["step"] for r in back if r["seq"] == 1] == [1, 2]
    first = next(r for r in back if r["step"] == 1)
    assert first["module"] == "lm_head" and first["nan"] == first["nonfinite"] == logits.numel()
