"""Curve statistics of the figures: seeds aligned by step, the bias-corrected EMA, spread over seeds."""
from __future__ import annotations

import math

import numpy as np
import pytest

from qerl.report.figures import ema_span, seed_band


def _ema(values, span):
    """The EMA by its definition: y_t = sum_i w_i x_i / sum_i w_i over finite x_i, w_i = (1 - alpha)^(t - i)."""
    alpha = 2.0 / (span + 1.0)
    out = []
    for t in range(len(values)):
        seen = [(i, x) for i, x in enumerate(values[:t + 1]) if x is not None and math.isfinite(x)]
        num = sum((1 - alpha) ** (t - i) * x for i, x in seen)
        den = sum((1 - alpha) ** (t - i) for i, _ in seen)
        out.append(num / den if den else math.nan)
    return out


def test_seed_band_aligns_steps_and_smooths_each_seed():
    a = {"step": [0, 1, 2, 3, 4, 5], "r": [float("nan"), 1.0, None, 4.0, 2.0, 8.0]}  # leading NaN, a null
    b = {"step": [0, 2, 3, 5], "r": [2.0, 3.0, 1.0, 5.0]}  # steps 1 and 4 missing
    steps, mean, low, high, raw = seed_band([a, b], "r", smooth=True)
    span = ema_span(6)
    ea = _ema(a["r"], span)
    eb = _ema([2.0, None, 3.0, 1.0, None, 5.0], span)
    ea = [x if v is not None and math.isfinite(v) else math.nan for x, v in zip(ea, a["r"])]
    eb = [x if v is not None else math.nan for x, v in zip(eb, [2.0, None, 3.0, 1.0, None, 5.0])]
    assert steps.tolist() == [0, 1, 2, 3, 4, 5]
    np.testing.assert_allclose(mean, np.nanmean([ea, eb], 0), rtol=1e-12)
    np.testing.assert_allclose(low, np.nanmin([ea, eb], 0), rtol=1e-12)
    np.testing.assert_allclose(high, np.nanmax([ea, eb], 0), rtol=1e-12)
    np.testing.assert_allclose(raw, [2.0, 1.0, 3.0, 2.5, 2.0, 6.5], rtol=1e-12)


def test_seed_band_unsmoothed_and_a_step_nobody_logged():
    steps, mean, low, high, raw = seed_band([{"step": [0, 2], "r": [1.0, 3.0]}, {"step": [2], "r": [None]}],
                                            "r", smooth=False)
    assert steps.tolist() == [0, 2] and mean.tolist() == [1.0, 3.0] and high.tolist() == raw.tolist()
    _, mean, *_ = seed_band([{"step": [0, 1], "r": [1.0, None]}], "r", smooth=False)
    assert mean[0] == 1.0 and math.isnan(mean[1])


def test_seed_band_names_a_missing_metric():
    with pytest.raises(ValueError, match="metric 'kl' is not in the run's metrics"):
        seed_band([{"step": [0], "r": [1.0]}], "kl", smooth=True)
