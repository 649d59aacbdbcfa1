"""AQN sigma schedules: Eq. 8 at every stage, stage boundaries, the four shapes' endpoints and order.

Run: `pytest tests/noise/test_aqn_schedule.py -q`
"""
from __future__ import annotations

import math

import pytest

from qerl.noise.schedule import SCHEDULES, NoiseSchedule, interpolate, sigma_at, stage_of

K, S_START, S_END = 10, 1e-2, 5e-4


@pytest.mark.parametrize("total_steps", [10, 600, 605, 1000], ids=lambda m: f"M{m}")
def test_exponential_matches_eq8_at_every_stage(total_steps):
    schedule = NoiseSchedule(total_steps, K, S_START, S_END, "exponential")
    seen = set()
    for t in range(total_steps):
        k = stage_of(t, total_steps, K)
        assert k == min(t * K // total_steps, K - 1)
        expected = 0.0 if k == 0 else S_START * (S_END / S_START) ** ((k - 1) / (K - 1))
        assert schedule.sigma(t) == pytest.approx(expected, rel=1e-12, abs=0.0)
        seen.add(k)
    assert seen == set(range(K))  # every stage is visited, stage 0 first
    assert schedule.stage_sigmas()[0] == 0.0 and schedule.stage_sigmas()[1] == S_START


def test_stage_boundaries_and_clamping():
    assert [stage_of(t, 600, 10) for t in (0, 59, 60, 119, 540, 599)] == [0, 0, 1, 1, 9, 9]
    assert stage_of(600, 600, 10) == 9 and stage_of(10_000, 600, 10) == 9  # past the plan: last stage
    lengths = [sum(1 for t in range(605) if stage_of(t, 605, 10) == k) for k in range(10)]
    assert set(lengths) <= {60, 61} and sum(lengths) == 605
    assert sigma_at(0, 600) == 0.0  # stage 0 adds nothing (quantization noise only)


@pytest.mark.parametrize("kind", SCHEDULES)
def test_shapes_share_endpoints_and_decrease(kind):
    assert interpolate(kind, 0.0, S_START, S_END) == pytest.approx(S_START)
    assert interpolate(kind, 1.0, S_START, S_END) == pytest.approx(S_END)
    values = [interpolate(kind, u / 50, S_START, S_END) for u in range(51)]
    assert all(a > b for a, b in zip(values, values[1:]))
    sigmas = NoiseSchedule(600, K, S_START, S_END, kind).stage_sigmas()
    assert sigmas[0] == 0.0 and sigmas[1] == pytest.approx(S_START) and len(sigmas) == K


def test_shapes_differ_as_documented():
    mid = {kind: interpolate(kind, 0.5, S_START, S_END) for kind in SCHEDULES}
    assert mid["exponential"] == pytest.approx(math.sqrt(S_START * S_END))
    assert mid["linear"] == pytest.approx((S_START + S_END) / 2) == pytest.approx(mid["cosine"])
    late = {kind: interpolate(kind, 0.8, S_START, S_END) for kind in SCHEDULES}
    assert late["exponential"] < late["logarithmic"] < late["cosine"] < late["linear"]


def test_bad_arguments_raise_value_error():
    with pytest.raises(ValueError, match="unknown AQN schedule 'step'"):
        NoiseSchedule(600, kind="step")
    with pytest.raises(ValueError, match="total_steps"):
        sigma_at(0, 0)
    with pytest.raises(ValueError, match="num_stages"):
        stage_of(0, 10, 0)
    with pytest.raises(ValueError, match="step must be >= 0"):
        stage_of(-1, 10, 10)
    with pytest.raises(ValueError, match="s_start and s_end"):
        NoiseSchedule(600, s_end=0.0)
