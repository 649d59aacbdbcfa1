"""Adaptive Quantization Noise (AQN, QeRL sec. 3.3): sigma schedules and noise merged into RMSNorm weights.

`schedule`: stage_of / sigma_at / NoiseSchedule (exponential Eq. 8, linear, cosine, logarithmic; stage 0 = no noise).
`aqn`: `applied(model, sigma, generator)` context manager and `AdaptiveQuantizationNoise` (schedule + seeding).
"""
from qerl.noise.aqn import NORM_TARGETS, AdaptiveQuantizationNoise, applied, find_norm_weights
from qerl.noise.schedule import SCHEDULES, NoiseSchedule, interpolate, sigma_at, stage_of

__all__ = [
    "NORM_TARGETS",
    "AdaptiveQuantizationNoise",
    "applied",
    "find_norm_weights",
    "SCHEDULES",
    "NoiseSchedule",
    "interpolate",
    "sigma_at",
    "stage_of",
]
