"""Noise-level schedules for Adaptive Quantization Noise (AQN): sigma as a function of the training step.

Why: QeRL (sec. 3.3, Eq. 8, Alg. 1) splits the M training steps into K equal stages. Stage 0 adds no noise (the
model explores with its NVFP4 quantization noise alone); from stage 1 on, Gaussian noise of standard deviation
sigma_k is merged into the RMSNorm weights of the rollout policy, decaying from s_start to s_end. The paper picks the
exponential decay of Eq. 8 and compares it with linear, cosine and logarithmic decay (Fig. 9, Fig. 15), which it only
draws; this module defines all four between the same endpoints so the Fig. 9 ablation can run.

How: `stage_of(t, M, K) = min(floor(t * K / M), K - 1)` for 0-based steps t; `sigma_at(t, ...)` is 0 in stage 0 and
`interpolate(kind, u, s_start, s_end)` with u = (k - 1) / (K - 1) in stage k >= 1. Shapes (all equal s_start at u = 0
and s_end at u = 1):
    exponential  s_start * (s_end / s_start) ** u                (Eq. 8: geometric, drops fastest early)
    linear       s_start + (s_end - s_start) * u
    cosine       s_end + (s_start - s_end) * (1 + cos(pi * u)) / 2  (slow, fast, slow)
    logarithmic  s_start - (s_start - s_end) * log(1 + 9 u) / log(10)  (falls like the exponential at first,
                                                                          then stays above it: more noise late)
Run the tests: `pytest tests/noise -q`; print a schedule: `python -m qerl.noise.schedule exponential 600 10`.

Deviations and ambiguities (documented):
- Eq. 8 applied literally to stages k = 1 .. K-1 (the brief's and Alg. 1's stage 0 = no noise) never reaches s_end:
  the last stage has s_start * (s_end / s_start) ** ((K-2)/(K-1)) (7.0e-4 for 1e-2 .. 5e-4, K = 10). App. F says the
  final stage "transitions to" the end value; we keep Eq. 8 as written, so the table of sigmas matches Eq. 8.
- Alg. 1 uses floor(M / K) steps per stage (leaving a short stage K when K does not divide M); we use
  floor(t * K / M) clamped to K - 1, so every stage has floor or ceil of M / K steps and there are exactly K stages.
- The paper's text gives two ranges (sec. 4.1: 5e-2 .. 5e-4; Table 4: 1e-2 .. 5e-4); the defaults here are Table 4's.
"""
from __future__ import annotations

import math
import sys
from dataclasses import dataclass

from qerl.contract.variants import AQN_SCHEDULES

__all__ = ["SCHEDULES", "NoiseSchedule", "stage_of", "interpolate", "sigma_at"]

SCHEDULES = AQN_SCHEDULES  # the one list of names (qerl.contract.variants), implemented below


def stage_of(step: int, total_steps: int, num_stages: int) -> int:
    """The AQN stage of a 0-based training step: min(floor(step * K / M), K - 1).

    Args:
        step: 0-based step t (steps at or past M stay in the last stage).
        total_steps: M, the planned number of training steps (>= 1).
        num_stages: K (>= 1).

    Returns:
        The stage k in [0, K - 1].

    Raises:
        ValueError: if step < 0, total_steps < 1 or num_stages < 1.
    """
    if total_steps < 1:
        raise ValueError(f"total_steps must be >= 1, got {total_steps}")
    if num_stages < 1:
        raise ValueError(f"num_stages must be >= 1, got {num_stages}")
    if step < 0:
        raise ValueError(f"step must be >= 0, got {step}")
    return min(step * num_stages // total_steps, num_stages - 1)


def interpolate(kind: str, u: float, s_start: float, s_end: float) -> float:
    """The decay shape `kind` at progress u in [0, 1], from s_start (u = 0) to s_end (u = 1).

    Args:
        kind: one of SCHEDULES.
        u: progress in [0, 1].
        s_start: noise level at u = 0 (> 0).
        s_end: noise level at u = 1 (> 0).

    Returns:
        sigma.

    Raises:
        ValueError: on an unknown kind, u outside [0, 1] or non-positive levels.
    """
    if kind not in SCHEDULES:
        raise ValueError(f"unknown AQN schedule {kind!r}; choose from {SCHEDULES}")
    if not 0.0 <= u <= 1.0:
        raise ValueError(f"progress u must be in [0, 1], got {u}")
    if not (s_start > 0 and s_end > 0):
        raise ValueError(f"s_start and s_end must be > 0, got {s_start} and {s_end}")
    if kind == "exponential":
        return s_start * (s_end / s_start) ** u
    if kind == "linear":
        return s_start + (s_end - s_start) * u
    if kind == "cosine":
        return s_end + (s_start - s_end) * 0.5 * (1.0 + math.cos(math.pi * u))
    return s_start - (s_start - s_end) * math.log1p(9.0 * u) / math.log(10.0)


def sigma_at(
    step: int, total_steps: int, num_stages: int = 10, s_start: float = 1e-2, s_end: float = 5e-4,
    kind: str = "exponential",
) -> float:
    """AQN's sigma at a 0-based training step (Eq. 8 and Alg. 1 for kind="exponential").

    Args:
        step: 0-based step t.
        total_steps: M.
        num_stages: K (Table 4 / sec. 3.3: 10).
        s_start: sigma of stage 1.
        s_end: sigma the decay heads to (reached at u = 1; see the module docstring).
        kind: one of SCHEDULES.

    Returns:
        0.0 in stage 0, else interpolate(kind, (k - 1) / (K - 1), s_start, s_end).

    Raises:
        ValueError: as `stage_of` and `interpolate`.
    """
    k = stage_of(step, total_steps, num_stages)
    if k == 0:
        interpolate(kind, 0.0, s_start, s_end)  # validate the arguments even when no noise is added
        return 0.0
    u = (k - 1) / (num_stages - 1)
    return interpolate(kind, u, s_start, s_end)


@dataclass(frozen=True)
class NoiseSchedule:
    """A schedule bound to its hyperparameters: `NoiseSchedule(total_steps=600).sigma(step)`.

    Attributes:
        total_steps: M.
        num_stages: K.
        s_start, s_end: the noise range (Table 4: 1e-2, 5e-4).
        kind: one of SCHEDULES.
    """

    total_steps: int
    num_stages: int = 10
    s_start: float = 1e-2
    s_end: float = 5e-4
    kind: str = "exponential"

    def __post_init__(self):
        sigma_at(0, self.total_steps, self.num_stages, self.s_start, self.s_end, self.kind)  # validates

    def stage(self, step: int) -> int:
        """The stage of a 0-based step (see `stage_of`)."""
        return stage_of(step, self.total_steps, self.num_stages)

    def sigma(self, step: int) -> float:
        """Sigma at a 0-based step (see `sigma_at`)."""
        return sigma_at(step, self.total_steps, self.num_stages, self.s_start, self.s_end, self.kind)

    def stage_sigmas(self) -> list[float]:
        """Sigma of each stage 0 .. K-1."""
        return [0.0] + [
            interpolate(self.kind, (k - 1) / (self.num_stages - 1), self.s_start, self.s_end)
            for k in range(1, self.num_stages)
        ]


if __name__ == "__main__":  # pragma: no cover
    kind, steps, stages = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    for k, s in enumerate(NoiseSchedule(steps, stages, kind=kind).stage_sigmas()):
        print(f"stage {k}: sigma {s:.6g}")
