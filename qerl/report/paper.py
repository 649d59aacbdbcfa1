"""Every number the QeRL paper (arXiv 2510.11696v1) reports, as data, so each artifact can print it beside ours.

Why: the paper's values must sit in their own column of every table and figure, copied once, checked once
(tests/report/test_paper.py spot-checks them against ../shared/paper/REPORTED.md and checks every Table 2 average),
never typed into a renderer. Pass@1 values are percentages (T = 0.6, top-p 0.95, 4096-token completions, averaged
over repeats). "3B" etc. mean Qwen2.5-3B-Instruct etc.

How: tables are lists of flat dicts (one per paper row). Rows of Tables 1 and 2 carry our method name
(qerl/contract/methods.py) so a row of ours and a row of the paper's can be matched by (model, method); the W# /
training labels are the paper's (our rows take theirs from the method registry). A value the paper leaves blank
("-") is None; a value that is not a number ("OOM", "10.6 s/step") is kept as text. Figures whose numbers the paper
does not print are described in FIGURES.

Notes copied from the paper, not fixed here: Table 9 at 32B gives NVFP4 r16 = 58.0 tokens/s while Table 8 gives 60.0
for the same setting; Table 9 is "batch 1" yet repeats Tables 5-8's batch-2 BF16 numbers. The 7B NVFP4 LoRA row of
Table 2 without AQN (37.0) is above the +AQN row (36.4).

Run: `python -m qerl.report.paper` prints the number of rows per table.
"""
from __future__ import annotations

__all__ = [
    "PAPER_ID",
    "TABLE1",
    "TABLE1_MODELS",
    "TABLE2",
    "TABLE2_MODELS",
    "TABLE2_BENCHMARKS",
    "TABLE3",
    "TABLE4",
    "TABLE5_8",
    "TABLE5_8_MODEL",
    "VLLM_MEMORY_UTILIZATION",
    "TABLE9",
    "TABLE9_RANKS",
    "FIG11_NOTE",
    "FIG1",
    "PAPER_LR",
    "AQN_STAGES",
    "SIGMA_RANGE",
    "FIGURES",
    "CLAIMS",
]

PAPER_ID = "arXiv 2510.11696v1"

def _t1(model: str, values: list[float]) -> list[dict]:
    rows = [
        ("bf16", "BF16", "-"), ("nf4", "NF4", "-"), ("mxfp4", "MXFP4", "-"), ("nvfp4", "NVFP4", "-"),
        ("full", "BF16", "Full"), ("lora", "BF16", "LoRA"), ("qlora", "NF4", "LoRA (QLoRA)"),
        ("mxfp4_lora", "MXFP4", "LoRA"), ("nvfp4_lora", "NVFP4", "LoRA (QeRL)"), ("qerl", "NVFP4", "LoRA + AQN"),
    ]
    assert len(rows) == len(values)
    return [
        {"model": model, "method": m, "wbits": w, "training": t, "gsm8k": v} for (m, w, t), v in zip(rows, values)
    ]


# Table 1: GSM8K pass@1 after GRPO (rows without training: the untrained model in that format).
TABLE1_MODELS = ("3B", "7B")
TABLE1: list[dict] = (
    _t1("3B", [61.2, 57.5, 59.8, 59.4, 84.4, 76.1, 76.1, 73.4, 83.3, 83.7])
    + _t1("7B", [76.3, 70.5, 71.3, 73.4, 91.2, 88.1, 85.0, 86.4, 88.5, 90.8])
)


def _t2(model: str, cells: list[tuple[float, float, float, float, float]]) -> list[dict]:
    rows = [
        ("bf16", "BF16", "-"), ("nvfp4", "NVFP4", "-"), ("full", "BF16", "Full"), ("lora", "BF16", "LoRA"),
        ("nvfp4_lora", "NVFP4", "LoRA"), ("qerl", "NVFP4", "LoRA + AQN"),
    ]
    assert len(rows) == len(cells)
    out = []
    for (m, w, t), (math500, aime24, aime25, amc23, avg) in zip(rows, cells):
        out.append({"model": model, "method": m, "wbits": w, "training": t, "math500": math500, "aime24": aime24,
                    "aime25": aime25, "amc23": amc23, "avg": avg})
    return out


# Table 2: BigMath, DAPO; pass@1 on MATH500 / AIME24 / AIME25 / AMC23 and their average.
TABLE2_MODELS = ("7B", "14B", "32B")
TABLE2_BENCHMARKS = ("math500", "aime24", "aime25", "amc23")
TABLE2: list[dict] = (
    _t2("7B", [(74.8, 9.2, 6.6, 25.0, 28.9), (73.7, 8.3, 3.3, 17.5, 25.7), (77.4, 16.7, 10.0, 45.0, 37.3),
               (77.0, 13.3, 10.0, 42.5, 35.7), (76.8, 13.7, 10.0, 47.5, 37.0), (77.4, 15.5, 10.0, 42.5, 36.4)])
    + _t2("14B", [(78.6, 11.3, 9.2, 45.0, 36.0), (76.4, 11.2, 8.3, 40.0, 34.0), (83.2, 20.0, 15.1, 55.0, 43.3),
                  (81.0, 14.0, 13.3, 52.5, 40.2), (79.4, 16.7, 13.3, 52.5, 40.5), (80.2, 17.5, 12.6, 57.5, 42.0)])
    + _t2("32B", [(81.4, 14.0, 10.8, 52.5, 39.7), (80.6, 11.3, 10.0, 45.0, 36.7), (84.0, 20.0, 23.3, 57.5, 46.2),
                  (83.6, 16.7, 13.3, 55.0, 42.2), (81.6, 16.7, 15.0, 52.5, 41.4), (83.3, 16.7, 19.2, 63.3, 45.6)])
)

# Table 3: model size and end-to-end GRPO step speedup over BF16 LoRA (1 x H100-80GB, prompt 256, completion <= 2048,
# average of the first 30 steps). None = the paper prints "-" (the reference row).
TABLE3: list[dict] = [
    {"model": "7B", "method": "lora", "wbits": "BF16", "size_gb": 15.2, "x_bs2": None, "x_bs4": None, "x_bs8": None},
    {"model": "7B", "method": "qlora", "wbits": "NF4", "size_gb": 5.7, "x_bs2": 0.8, "x_bs4": 0.8, "x_bs8": 0.7},
    {"model": "7B", "method": "qerl", "wbits": "NVFP4", "size_gb": 5.9, "x_bs2": 1.5, "x_bs4": 1.4, "x_bs8": 1.2},
    {"model": "14B", "method": "lora", "wbits": "BF16", "size_gb": 29.6, "x_bs2": None, "x_bs4": None, "x_bs8": None},
    {"model": "14B", "method": "qlora", "wbits": "NF4", "size_gb": 10.2, "x_bs2": 0.9, "x_bs4": 0.7, "x_bs8": 0.7},
    {"model": "14B", "method": "qerl", "wbits": "NVFP4", "size_gb": 10.6, "x_bs2": 1.4, "x_bs4": 1.2, "x_bs8": 1.2},
]

# Table 4: hyperparameters (GRPO and DAPO; no entropy or KL loss). key -> the paper's value, as printed.
TABLE4: list[dict] = [
    {"key": "optimizer", "label": "optimizer", "paper": "AdamW-8bit"},
    {"key": "lr", "label": "policy lr", "paper": "1e-5 (QeRL, QLoRA) / 5e-6 (BF16 LoRA; higher collapses)"},
    {"key": "batch_size", "label": "training batch size", "paper": "128 prompts"},
    {"key": "group_size", "label": "samples per prompt", "paper": "8 (GSM8K) / 16 (BigMath)"},
    {"key": "updates_per_rollout", "label": "policy updates per rollout",
     "paper": "4 (GSM8K, off-policy) / 1 (BigMath, on-policy)"},
    {"key": "max_response_length", "label": "max response length", "paper": "4096 (GSM8K) / 8192 (BigMath)"},
    {"key": "temperature", "label": "rollout temperature", "paper": "1.0"},
    {"key": "clip_eps", "label": "clip eps_low, eps_high", "paper": "0.2, 0.28"},
    {"key": "sigma", "label": "noise sigma_start, sigma_end", "paper": "1e-2, 5e-4 (sec. 4.1 says 5e-2 .. 5e-4)"},
    {"key": "aqn_stages", "label": "AQN stages K", "paper": "10"},
    {"key": "lora_rank", "label": "LoRA rank", "paper": "32 (main), 16/32/64/128 in the ablation"},
]
PAPER_LR = {"qerl": 1e-5, "nvfp4_lora": 1e-5, "qlora": 1e-5, "lora": 5e-6}
AQN_STAGES = 10
SIGMA_RANGE = (1e-2, 5e-4)  # Table 4 (sec. 4.1 says 5e-2 .. 5e-4)


def _t58(model, size_bf16, size_nvfp4, rows):
    out = []
    for batch, bf16_tps, nvfp4_tps, rollout_x, e2e_bf16, e2e_gc_bf16, e2e_nvfp4, e2e_gc_nvfp4 in rows:
        out.append({"model": model, "method": "lora", "wbits": "BF16", "size_gb": size_bf16, "batch": batch,
                    "rollout_tps": bf16_tps, "rollout_x": None, "e2e_x": e2e_bf16, "e2e_x_gc": e2e_gc_bf16})
        out.append({"model": model, "method": "qerl", "wbits": "NVFP4", "size_gb": size_nvfp4, "batch": batch,
                    "rollout_tps": nvfp4_tps, "rollout_x": rollout_x, "e2e_x": e2e_nvfp4, "e2e_x_gc": e2e_gc_nvfp4})
    return out


# Tables 5-8 (one per model): rollout tokens/s (vLLM), rollout speedup, E2E speedup without / with gradient
# checkpointing. BF16 rows are the reference ("-" = None); "OOM" and "<t> s/step" are kept as printed.
TABLE5_8: list[dict] = (
    _t58("3B", 6.2, 2.8, [(2, 151.2, 157.0, 1.0, None, None, 1.1, 1.0), (8, 2226.3, 2271.4, 1.0, None, None, 1.1, 1.1)])
    + _t58("7B", 15.2, 5.9, [(2, 115.4, 151.6, 1.3, None, None, 1.2, 1.2),
                             (8, 1641.1, 2091.8, 1.3, None, None, 1.1, 1.1)])
    + _t58("14B", 29.6, 10.6, [(2, 65.4, 95.3, 1.3, None, None, 1.4, 1.4),
                               (8, 737.2, 1091.1, 1.5, "OOM", None, "OOM", 1.3)])
    + _t58("32B", 62.3, 20.7, [(2, 34.0, 60.0, 1.8, "OOM", "OOM", "OOM", "10.6 s/step"),
                               (8, 344.3, 688.2, 2.0, "OOM", "OOM", "OOM", "12.2 s/step")])
)
TABLE5_8_MODEL = {"table5": "3B", "table6": "7B", "table7": "14B", "table8": "32B"}
VLLM_MEMORY_UTILIZATION = {"3B": 0.20, "7B": 0.30, "14B": 0.45, "32B": 0.40}

# Table 9 / Figure 11: rollout tokens/s at batch 1 by LoRA rank (vLLM). QLoRA was measured at 14B and 32B only.
TABLE9_RANKS = (16, 32, 64)


def _t9(model, bf16, nvfp4, qlora=None):
    out = []
    for method, values in (("lora", bf16), ("qerl", nvfp4), ("qlora", qlora)):
        if values is None:
            continue
        for rank, v in zip(TABLE9_RANKS, values):
            out.append({"model": model, "method": method, "rank": rank, "tokens_per_s": v})
    return out


TABLE9: list[dict] = (
    _t9("3B", (151.2, 148.8, 138.6), (157.0, 153.1, 140.0))
    + _t9("7B", (115.4, 113.2, 108.3), (151.6, 149.9, 137.7))
    + _t9("14B", (65.4, 63.1, 61.2), (95.3, 92.9, 86.0), (45.1, 44.2, 42.8))
    + _t9("32B", (34.0, 33.3, 31.9), (58.0, 56.0, 51.3), (25.2, 25.6, 23.0))
)
FIG11_NOTE = "Fig. 11 labels 2.0-2.3x are QeRL over QLoRA."

# Figure 1 (7B): the paper draws bars whose values are those of Tables 1, 3 and 6; we take them from there.
FIG1 = {
    "rollout_tps_bs8": {"lora": 1641.1, "qerl": 2091.8},  # Table 6 (QLoRA's 7B rollout speed is not printed)
    "e2e_x_bs8": {"lora": 1.0, "qlora": 0.7, "qerl": 1.2},  # Table 3 (LoRA is the reference, 1.0 by definition)
    "gsm8k": {"lora": 88.1, "qlora": 85.0, "qerl": 90.8, "full": 91.2},  # Table 1, 7B
}

# The paper's ablation settings (Figs. 9, 10, 16, 17) are the schema's defaults of train.ablations.

# Figures the paper only draws: what they show, in words (REPORTED.md, "Figures").
FIGURES: dict[str, str] = {
    "fig1": "7B rollout and E2E speed (batch 8) and accuracy bars: LoRA, QLoRA, QeRL, full.",
    "fig3": "Policy entropy vs step: 4-bit LoRA (NVFP4, MXFP4, NF4) above BF16 LoRA, most at the start.",
    "fig4": ("Accuracy reward vs step, DAPO (top) and GRPO (bottom), 7B r32: NVFP4/MXFP4/NF4 LoRA vs BF16 LoRA vs "
             "BF16 full; MXFP4 rises first, NVFP4 ends highest; NVFP4 and MXFP4 above NF4."),
    "fig5": "Policy entropy vs step, 7B, r32, GSM8K, steps 0-200, entropy ~0.1-0.3; 4-bit LoRA above BF16 LoRA.",
    "fig7": ("BigMath reward, 7B/14B (levels 3-5, 250 steps): QeRL vs LoRA vs full; QeRL rises within ~200 steps, "
             "LoRA needs >500."),
    "fig8": "AQN ablation, 3B (80 steps) and 7B (250 steps): with vs without AQN.",
    "fig9": ("Noise schedulers (linear, exponential, cosine, logarithmic) over 10 stages: reward (3B, 150 steps); "
             "exponential is the most stable late in training."),
    "fig10": "LoRA rank 16/32/64/128: reward (3B, 150 steps).",
    "fig11": "Rollout tokens/s at batch 1 by LoRA rank (the numbers of Table 9). " + FIG11_NOTE,
    "fig12": "BigMath reward (appendix H), 7B/14B, levels 3-5, 250 steps: QeRL vs LoRA vs full.",
    "fig13": "BigMath reward (appendix H), 32B, levels 4-5, 500 steps: QeRL vs LoRA vs full.",
    "fig14": "Policy entropy vs step, 14B, 600 steps: 4-bit LoRA above BF16 LoRA.",
    "fig15": "The noise schedules of Fig. 9 (sigma per step over 10 stages).",
    "fig16": "QeRL at lr 5e-6 vs 3e-5 (7B, 200 steps): stable at 3e-5, reward rises ~2x faster.",
    "fig17": "BF16 LoRA at lr 5e-6 vs 3e-5 (7B, 200 steps): collapses at 3e-5.",
}

CLAIMS = (
    "Rollout >1.5x faster than BF16 LoRA; E2E 1.2-1.5x; QLoRA 0.7-0.9x.",
    "32B GRPO on one 80 GB GPU.",
    "4-bit LoRA RL has higher entropy and faster reward growth than BF16 LoRA.",
    "QeRL (+AQN) >= BF16 LoRA accuracy, close to full fine-tuning.",
    "Exponential AQN schedule is the most stable late in training.",
)


if __name__ == "__main__":  # pragma: no cover
    for name in ("TABLE1", "TABLE2", "TABLE3", "TABLE4", "TABLE5_8", "TABLE9"):
        print(f"{name}: {len(globals()[name])} rows")
