"""A short supervised warm-up on the GSM8K training split's answer format, before RL (the small scale).

Why: SmolLM2-135M-Instruct almost never writes the paper's `<think> ... </think> <answer> ... </answer>` reply, so
its rewards are ~all zero and GRPO has nothing to learn from (no group with mixed rewards). A few hundred steps of
supervised fine-tuning on GSM8K *training* solutions, rewritten into that format, teach the format and the habit of
working the problem; RL then starts from a policy whose rewards are sometimes 1. It is an explicit stage of the DAG
(rule `sft`), off unless `sft.steps > 0`; when on, the converted model is written to R/models/<model>/pretrained/
and this stage writes R/models/<model>/base/, the checkpoint every later stage (calibration, quantization, the
untrained rows, RL) starts from, so "untrained" in the tables means "after the SFT warm-up, before RL".
GSM8K test is never read here: it stays the held-out benchmark.

How: each training row becomes prompt (the paper's instruction in the model's chat template, as in RL) +
completion (`qerl.models.pretrain.completion_text`: the solution's steps inside <think>, its final answer inside
<answer>, GSM8K's `<<48/2=24>>` calculator notes removed) + EOS; the loss is on the completion only; rows longer than
`sft.max_tokens` are dropped. The loop is the tiny scale's pretraining loop (AdamW, warm-up, cosine decay), on the
device asked for (the DAG's `sft` rule: the GPU on a GPU config); on a GPU in mixed precision (float32 weights and
optimizer, bfloat16 autocast for the forward and backward: float32 matmuls alone made it ~150 s on an H100). OUT/sft_metrics.jsonl holds the loss every 50
steps, OUT/sft_info.json the settings, row counts, time and the source folder.

Run (qerl/commands/sft.py): `qerl sft --config config/small.yaml --base results/small/models/smollm2-135m/pretrained
      --out results/small/models/smollm2-135m/base`
Run the tests: `pytest tests/models/test_sft.py -q`.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import torch

from qerl.io import atomic_dir

__all__ = ["CALCULATOR_NOTE", "sft_rows", "run_sft"]

#: GSM8K's calculator annotations inside solutions, e.g. "<<48/2=24>>".
CALCULATOR_NOTE = re.compile(r"<<[^<>]*>>")


def sft_rows(problems) -> list[dict]:
    """GSM8K problems (qerl.data.benchmarks.Problem with a `solution`) as rows for `encode_examples`: the question
    and the solution without calculator notes (it still ends in `#### N`)."""
    rows = []
    for p in problems:
        if not p.solution or "####" not in p.solution:
            raise ValueError(f"{p.id}: SFT needs a worked solution ending in '#### N' (sft.source must be gsm8k)")
        rows.append({"question": p.question, "answer": CALCULATOR_NOTE.sub("", p.solution)})
    return rows


def run_sft(cfg: dict, base: str | Path, out: str | Path, device: str = "cpu") -> dict:
    """Fine-tune the model in `base` on `sft.source`'s training split and save it (with its tokenizer) to `out`.

    Args:
        cfg: a validated config (sections sft, data, prompt).
        base: the converted model folder (prepare_model's output).
        out: the folder to write (atomically).
        device: cpu (the default, as every stage's: the DAG passes cuda on a GPU config), cuda, cuda:N, or
            auto (a CUDA GPU when there is one).

    Returns:
        What OUT/sft_info.json holds.

    Raises:
        ValueError: sft.steps is 0, or no training row fits sft.max_tokens.
    """
    from qerl.data.benchmarks import load_benchmark
    from qerl.models.pretrain import encode_examples, pretrain
    from qerl.policy.core import load_base

    sc = cfg["sft"]
    if sc["steps"] <= 0:
        raise ValueError("config key 'sft.steps' is 0: the SFT stage is off (set it > 0 to run `qerl sft`)")
    device = ("cuda" if torch.cuda.is_available() else "cpu") if device == "auto" else device
    model, tokenizer = load_base(base, "float32", device)
    if model.config.pad_token_id is None:
        model.config.pad_token_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    problems = load_benchmark(sc["source"], cfg["data"]["root"], split="train", limit=sc["limit"])
    examples = encode_examples(sft_rows(problems), tokenizer, cfg["prompt"]["instruction"])
    kept = [e for e in examples if len(e[0]) <= sc["max_tokens"]]
    if not kept:
        raise ValueError(f"no {sc['source']} training row fits config key 'sft.max_tokens' = {sc['max_tokens']}")
    with atomic_dir(out) as tmp:
        stats = pretrain(model, kept, steps=sc["steps"], time_budget_s=float("inf"), batch_size=sc["batch_size"],
                         lr=sc["lr"], warmup_steps=sc["warmup_steps"], weight_decay=sc["weight_decay"],
                         seed=sc["seed"], log_path=tmp / "sft_metrics.jsonl", desc="sft",
                         autocast_dtype=torch.bfloat16 if torch.device(device).type == "cuda" else None)
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        info = {"source": sc["source"], "rows": len(examples), "rows_kept": len(kept),
                "epochs": round(stats["steps"] * sc["batch_size"] / len(kept), 2), "settings": sc,
                "from": str(base), "device": str(device),
                "compute": "bfloat16 autocast" if torch.device(device).type == "cuda" else "float32", **stats}
        (tmp / "sft_info.json").write_text(json.dumps(info, indent=2) + "\n")
    return info
