"""The batch-sweep artifact's arithmetic: speedups per batch from rollout rows, the roofline ceiling (NVFP4 vs BF16
~2.9x at batch 1 for 7B, falling as the KV cache and then the FLOPs take over), and the verdict per regime."""
from __future__ import annotations

import pytest

from qerl.profiling.archs import ARCHS
from qerl.report.batch_sweep import MEAN_CONTEXT, regime_verdicts, speedups, step_floor


def _row(method, batch, tps, rank=32):
    return {"model": "7B", "method": method, "rank": rank, "batch": batch, "tokens_per_s": tps}


def test_speedups_take_the_first_row_of_a_batch_at_the_rank():
    rows = [_row("lora", 1, 100.0), _row("qerl", 1, 150.0), _row("qerl", 1, 160.0), _row("lora", 8, 800.0),
            _row("qerl", 8, 400.0), _row("qerl", 1, 999.0, rank=16), _row("qerl", 64, 1.0)]
    assert speedups(rows, "7B", "qerl") == {1: 1.5, 8: 0.5}  # no BF16 row at 64: no ratio there


def test_roofline_ceiling_for_7b():
    a = ARCHS["7B"]
    ratio = {b: step_floor(a, "lora", b, MEAN_CONTEXT, 4437, 795) / step_floor(a, "qerl", b, MEAN_CONTEXT, 4437, 795)
             for b in (1, 64, 256, 4096)}
    assert 2.8 < ratio[1] < 3.0  # 14.2 GB of BF16 weights + LM head + LoRA against 4.8 GB
    assert ratio[1] > ratio[64] > ratio[256] > 1.0 and ratio[4096] == pytest.approx(1.0, abs=0.01)
    weights_only = step_floor(a, "lora", 256, MEAN_CONTEXT, 4437, 795, kv=False) / \
        step_floor(a, "qerl", 256, MEAN_CONTEXT, 4437, 795, kv=False)
    assert weights_only == pytest.approx(1.0, abs=0.02)  # compute-bound from ~256 rows on (the estimate)
    assert 1 / step_floor(a, "qerl", 1, MEAN_CONTEXT, 4437, 795) == pytest.approx(870, rel=0.08)  # issue: ~870


def test_regime_verdicts():
    v = {name: (span, short) for name, span, _, short in
         regime_verdicts({1: 1.6, 8: 1.55, 16: 1.2, 64: 0.9, 128: 0.8, 256: 0.7})}
    assert v["batch <= 8"] == ("1.55-1.60x over 2 batch sizes", "holds")
    assert v["batch 16-64"][1] == "mixed" and v["batch >= 128"][1] == "slower"
    assert regime_verdicts({2: 1.3})[0][1:4:2] == ("1.30x at 1 batch size", "faster, below 1.5x")
    assert regime_verdicts({}) == []


def test_regimes_where_bf16_lora_ran_out_of_memory():
    """32B on an 80 GB card: BF16 LoRA out of memory from batch 16; the regime says so with QeRL's tok/s, and the
    model still counts as swept (its QeRL rows reach batch 64)."""
    from qerl.report.batch_sweep import baseline_oom, sweep_claim_lines, swept_models

    rows = [_row("lora", 1, 40.0), _row("qerl", 1, 88.0), _row("lora", 8, 280.0), _row("qerl", 8, 540.0),
            _row("lora", 16, "OOM"), _row("qerl", 16, 981.0), _row("lora", 64, "OOM"), _row("qerl", 64, 2080.0),
            _row("lora", 128, "OOM"), _row("qerl", 128, "OOM")]
    oom = baseline_oom(rows, "7B", "qerl")
    assert oom == {16: 981.0, 64: 2080.0}  # both OOM at 128: nothing said there
    assert swept_models(rows) == ["7B"] and swept_models(rows[:4]) == []  # batch 1-8 only: no sweep
    v = {name: (span, short) for name, span, _, short in regime_verdicts(speedups(rows, "7B", "qerl"), oom)}
    assert v["batch <= 8"] == ("1.93-2.20x over 2 batch sizes", "holds")
    assert v["batch 16-64"] == ("QeRL 981, 2,080 tok/s at batch 16, 64", "BF16 LoRA out of memory")
    assert "batch >= 128" not in v
    mixed = regime_verdicts({16: 1.2}, {32: 1500.0})[0]
    assert mixed[1] == "1.20x at 1 batch size; BF16 LoRA out of memory at batch 32 (QeRL 1,500 tok/s at batch 32)"

    class Ctx:
        def measured(self, name):
            return rows

        def measured_model(self, model):
            return model

        def measured_gpus_line(self, *a, **k):
            return ""

    lines, summary = sweep_claim_lines(Ctx())
    assert summary == ("7B: batch <= 8 holds (1.93-2.20x); batch 16-64 BF16 LoRA out of memory "
                       "(QeRL 981, 2,080 tok/s at batch 16, 64)")
