"""The paper's numbers as encoded in qerl.report.paper: spot checks against REPORTED.md and internal consistency."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from qerl.report import paper

REPORTED = Path(os.environ.get("QERL_REPORTED_MD", Path(__file__).resolve().parents[3] / "shared" / "paper"
                               / "REPORTED.md"))


def _row(rows, **match):
    hits = [r for r in rows if all(r[k] == v for k, v in match.items())]
    assert len(hits) == 1, (match, hits)
    return hits[0]


# (table, match, key, value, the line of REPORTED.md that holds it)
SPOT = [
    (paper.TABLE1, {"model": "3B", "method": "bf16"}, "gsm8k", 61.2, "| 3B | BF16 | - | 61.2 |"),
    (paper.TABLE1, {"model": "3B", "method": "qerl"}, "gsm8k", 83.7, "| 3B | NVFP4 | LoRA + AQN | 83.7 |"),
    (paper.TABLE1, {"model": "7B", "method": "qlora"}, "gsm8k", 85.0, "| 7B | NF4 | LoRA (QLoRA) | 85.0 |"),
    (paper.TABLE1, {"model": "7B", "method": "full"}, "gsm8k", 91.2, "| 7B | BF16 | Full | 91.2 |"),
    (paper.TABLE2, {"model": "7B", "method": "nvfp4_lora"}, "avg", 37.0,
     "| 7B | NVFP4 | LoRA | 76.8 | 13.7 | 10.0 | 47.5 | 37.0 |"),
    (paper.TABLE2, {"model": "14B", "method": "full"}, "aime25", 15.1,
     "| 14B | BF16 | Full | 83.2 | 20.0 | 15.1 | 55.0 | 43.3 |"),
    (paper.TABLE2, {"model": "32B", "method": "qerl"}, "amc23", 63.3,
     "| 32B | NVFP4 | LoRA + AQN | 83.3 | 16.7 | 19.2 | 63.3 | 45.6 |"),
    (paper.TABLE3, {"model": "14B", "method": "qerl"}, "size_gb", 10.6,
     "| 14B | QeRL | NVFP4 | 10.6 GB | 1.4 | 1.2 | 1.2 |"),
    (paper.TABLE3, {"model": "7B", "method": "qlora"}, "x_bs8", 0.7, "| 7B | QLoRA | NF4 | 5.7 GB | 0.8 | 0.8 | 0.7 |"),
    (paper.TABLE5_8, {"model": "7B", "method": "qerl", "batch": 8}, "rollout_tps", 2091.8,
     "| 7B | QeRL | NVFP4 | 5.9 GB | 8 | 2091.8 | 1.3 | 1.1 | 1.1 |"),
    (paper.TABLE5_8, {"model": "32B", "method": "qerl", "batch": 2}, "e2e_x_gc", "10.6 s/step",
     "| 32B | QeRL | NVFP4 | 20.7 GB | 2 | 60.0 | 1.8 | OOM | 10.6 s/step |"),
    (paper.TABLE5_8, {"model": "14B", "method": "lora", "batch": 8}, "e2e_x", "OOM",
     "| 14B | LoRA | BF16 | 29.6 GB | 8 | 737.2 | - | OOM | - |"),
    (paper.TABLE9, {"model": "32B", "method": "qerl", "rank": 16}, "tokens_per_s", 58.0,
     "| 32B | 34.0 | 33.3 | 31.9 | 58.0 | 56.0 | 51.3 | 25.2 | 25.6 | 23.0 |"),
    (paper.TABLE9, {"model": "14B", "method": "qlora", "rank": 64}, "tokens_per_s", 42.8,
     "| 14B | 65.4 | 63.1 | 61.2 | 95.3 | 92.9 | 86.0 | 45.1 | 44.2 | 42.8 |"),
]


@pytest.mark.parametrize("rows,match,key,value,line", SPOT, ids=[f"{s[1]}-{s[2]}" for s in SPOT])
def test_spot_values(rows, match, key, value, line):
    assert _row(rows, **match)[key] == value
    if REPORTED.exists():
        assert line in REPORTED.read_text(), f"{line!r} not in {REPORTED}"


def test_tables_1_and_2_match_reported_line_by_line():
    if not REPORTED.exists():
        pytest.skip(f"{REPORTED} not found (set QERL_REPORTED_MD)")
    text = REPORTED.read_text()
    for r in paper.TABLE1:
        assert f"| {r['model']} | {r['wbits']} | {r['training']} | {r['gsm8k']:.1f} |" in text, r
    for r in paper.TABLE2:
        cells = " | ".join(f"{r[k]:.1f}" for k in ("math500", "aime24", "aime25", "amc23", "avg"))
        assert f"| {r['model']} | {r['wbits']} | {r['training']} | {cells} |" in text, r


@pytest.mark.parametrize("row", paper.TABLE2, ids=lambda r: f"{r['model']}-{r['method']}")
def test_table2_average_is_mean_of_four_cells(row):
    mean = sum(row[b] for b in paper.TABLE2_BENCHMARKS) / 4
    assert abs(mean - row["avg"]) <= 0.05 + 1e-9


def test_shapes():
    assert len(paper.TABLE1) == 20 and len(paper.TABLE2) == 18 and len(paper.TABLE3) == 6
    assert len(paper.TABLE5_8) == 16 and len(paper.TABLE9) == 3 * (2 + 2 + 3 + 3)
    assert {r["key"] for r in paper.TABLE4} >= {"lr", "batch_size", "group_size", "updates_per_rollout",
                                                "max_response_length", "temperature", "clip_eps", "sigma",
                                                "lora_rank"}
    assert set(paper.TABLE5_8_MODEL.values()) == {"3B", "7B", "14B", "32B"}
