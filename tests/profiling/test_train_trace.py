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
