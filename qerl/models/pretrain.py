"""Pretrain the tiny scale's base model on generated worked solutions, then report its pass@1 per level.

Why: RL needs a policy that already solves some problems (reward > 0) but not all (room to improve). The tiny
model is trained by supervised next-token prediction on the completion "<think> steps </think> <answer> N
</answer>" of `pretrain.jsonl` (prompt tokens are context only), for a fixed number of steps or a wall-clock
budget, whichever comes first; then it samples at T=0.6 on the held-out test split and reports accuracy per level.

Run: `qerl pretrain-tiny --config config/config.yaml --data results/tiny/data/tiny --out results/tiny/models/tiny/base`
Outputs: OUT/ (config.json, model.safetensors, tokenizer files), OUT/pretrain_metrics.jsonl (loss per 50 steps),
OUT/eval.json (pass@1 per level, untrained vs trained). Live loss on stderr (a bar on a terminal, a line every 50 steps in a log).
"""
from __future__ import annotations

import json
import math
import random
import time
from pathlib import Path

import torch

from qerl.data.prompts import build_prompt
from qerl.data.answers import answer_tag
from qerl.io import atomic_dir
from qerl.models.tiny import build_model, build_tokenizer
from qerl.readout import Readout

__all__ = ["completion_text", "encode_examples", "pretrain", "evaluate_levels", "pretrain_tiny"]


def completion_text(row: dict) -> str:
    """The target completion for a GSM8K-format row: its steps inside <think>, its answer inside <answer>; a row
    marked with the direct-answer habit (qerl.data.tiny.add_direct_answers) answers its guess with an empty <think>."""
    if "direct" in row:
        return f"<think> </think> <answer> {row['direct']} </answer>"
    steps, _, final = row["answer"].rpartition("####")
    return f"<think> {steps.strip()} </think> <answer> {final.strip()} </answer>"


def encode_examples(rows: list[dict], tokenizer, instruction: str) -> list[tuple[list[int], int]]:
    """(token ids of prompt + completion + eos, number of prompt tokens) for each row."""
    prompts = [build_prompt(r["question"], tokenizer, instruction) for r in rows]
    completions = [completion_text(r) for r in rows]
    p_ids = tokenizer(prompts, add_special_tokens=False)["input_ids"]
    c_ids = tokenizer(completions, add_special_tokens=False)["input_ids"]
    eos = tokenizer.eos_token_id
    return [(p + c + [eos], len(p)) for p, c in zip(p_ids, c_ids)]


def _batch(examples: list[tuple[list[int], int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    width = max(len(ids) for ids, _ in examples)
    input_ids = torch.full((len(examples), width), pad_id, dtype=torch.long)
    labels = torch.full((len(examples), width), -100, dtype=torch.long)
    attn = torch.zeros((len(examples), width), dtype=torch.long)
    for i, (ids, n_prompt) in enumerate(examples):
        input_ids[i, : len(ids)] = torch.tensor(ids)
        labels[i, n_prompt : len(ids)] = torch.tensor(ids[n_prompt:])
        attn[i, : len(ids)] = 1
    return input_ids, attn, labels


def pretrain(model, examples, *, steps: int, time_budget_s: float, batch_size: int, lr: float, warmup_steps: int,
             weight_decay: float, seed: int, log_path: Path | None = None, desc: str = "pretrain",
             autocast_dtype: torch.dtype | None = None) -> dict:
    """Supervised training loop (AdamW, linear warmup, cosine decay) on the device the model sits on.

    Also the small scale's SFT warm-up (qerl.models.sft), which on a GPU passes autocast_dtype=torch.bfloat16: the
    forward and backward run in bfloat16 on the tensor cores while the weights and AdamW stay float32 (mixed
    precision). Returns {"steps", "seconds", "final_loss"}."""
    torch.manual_seed(seed)
    rng = random.Random(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay, betas=(0.9, 0.95))
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / max(1, warmup_steps)) * 0.5 * (1 + math.cos(math.pi * min(1.0, s / steps))))
    model.train()
    pad_id = model.config.pad_token_id
    order: list[int] = []
    start, ema, step = time.perf_counter(), None, 0
    log = open(log_path, "w") if log_path else None
    bar = Readout(steps, 0, desc, every=50)
    device = next(model.parameters()).device
    try:
        while step < steps and time.perf_counter() - start < time_budget_s:
            if len(order) < batch_size:
                order = list(range(len(examples)))
                rng.shuffle(order)
            idx, order = order[:batch_size], order[batch_size:]
            input_ids, attn, labels = (t.to(device) for t in _batch([examples[i] for i in idx], pad_id))
            with torch.autocast(device.type, dtype=autocast_dtype or torch.bfloat16, enabled=autocast_dtype is not None):
                loss = model(input_ids=input_ids, attention_mask=attn, labels=labels).loss
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            step += 1
            ema = loss.item() if ema is None else 0.98 * ema + 0.02 * loss.item()
            bar.step(loss=ema)
            if log and step % 50 == 0:
                log.write(json.dumps({"step": step, "loss": round(ema, 5), "lr": sched.get_last_lr()[0],
                                      "seconds": round(time.perf_counter() - start, 2)}) + "\n")
                log.flush()
    finally:
        bar.close()
        if log:
            log.close()
    model.eval()
    return {"steps": step, "seconds": round(time.perf_counter() - start, 1), "final_loss": ema}


@torch.no_grad()
def evaluate_levels(model, tokenizer, rows: list[dict], instruction: str, temperature: float, seed: int,
                    max_new_tokens: int = 96, batch_size: int = 256) -> dict:
    """pass@1 per level (one sample per problem at `temperature`), graded by exact match of the <answer> tag."""
    torch.manual_seed(seed)
    model.eval()
    correct: dict[int, list[int]] = {}
    for i in range(0, len(rows), batch_size):
        chunk = rows[i : i + batch_size]
        prompts = [build_prompt(r["question"], tokenizer, instruction) for r in chunk]
        enc = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
        out = model.generate(**enc, do_sample=temperature > 0, temperature=temperature if temperature > 0 else None,
                             top_p=1.0, top_k=0, max_new_tokens=max_new_tokens,
                             pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
        texts = tokenizer.batch_decode(out[:, enc["input_ids"].shape[1]:], skip_special_tokens=True)
        for r, t in zip(chunk, texts):
            correct.setdefault(r["level"], []).append(int(answer_tag(t) == r["final"]))
    per_level = {str(k): round(100.0 * sum(v) / len(v), 1) for k, v in sorted(correct.items())}
    n = sum(len(v) for v in correct.values())
    return {"per_level": per_level, "overall": round(100.0 * sum(sum(v) for v in correct.values()) / n, 1), "n": n,
            "temperature": temperature}


def _read_jsonl(path: Path) -> list[dict]:
    from qerl.data.benchmarks import load_jsonl

    return load_jsonl(path)


def pretrain_tiny(cfg: dict, data_dir: str | Path, out: str | Path, threads: int | None = None) -> dict:
    """Build the tiny tokenizer and model, pretrain it on `data_dir`/pretrain.jsonl and write it to `out` (atomically),
    with eval.json: pass rates per level before and after, and the pretraining statistics.

    Args:
        cfg: the validated config (reads tiny_model, prompt).
        data_dir: the folder of pretrain.jsonl and test.jsonl (qerl gen-tiny).
        out: the model folder to write.
        threads: torch threads (the Snakemake job's allotment, which --cores / --max-threads may cap below the
            config's); None: tiny_model.pretrain.threads.

    Returns:
        What eval.json holds.

    Raises:
        ValueError: a pretraining sequence longer than tiny_model.max_position.
    """
    tm, pt = cfg["tiny_model"], cfg["tiny_model"]["pretrain"]
    torch.set_num_threads(threads if threads is not None else pt["threads"])
    instruction = cfg["prompt"]["instruction"]
    data = Path(data_dir)
    train_rows = _read_jsonl(data / "pretrain.jsonl")
    test_rows = _read_jsonl(data / "test.jsonl")
    rng = random.Random(pt["seed"])
    by_level: dict[int, list[dict]] = {}
    for r in test_rows:
        by_level.setdefault(r["level"], []).append(r)
    eval_rows = [r for lv in sorted(by_level) for r in rng.sample(by_level[lv], min(pt["eval_per_level"], len(by_level[lv])))]

    tokenizer = build_tokenizer()
    model = build_model(tokenizer, tm["hidden_size"], tm["intermediate_size"], tm["num_layers"], tm["num_heads"],
                        tm["num_kv_heads"], tm["max_position"], seed=pt["seed"])
    examples = encode_examples(train_rows, tokenizer, instruction)
    longest = max(len(ids) for ids, _ in examples)
    if longest > tm["max_position"]:
        raise ValueError(f"tiny_model.max_position = {tm['max_position']} but a pretraining sequence has {longest} tokens")
    untrained = evaluate_levels(model, tokenizer, eval_rows, instruction, pt["eval_temperature"], pt["seed"], max_new_tokens=24)

    with atomic_dir(out) as tmp:
        stats = pretrain(model, examples, steps=pt["steps"], time_budget_s=pt["time_budget_s"],
                         batch_size=pt["batch_size"], lr=pt["lr"], warmup_steps=pt["warmup_steps"],
                         weight_decay=pt["weight_decay"], seed=pt["seed"], log_path=tmp / "pretrain_metrics.jsonl")
        trained = evaluate_levels(model, tokenizer, eval_rows, instruction, pt["eval_temperature"], pt["seed"])
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        report = {"train": stats, "untrained": untrained, "trained": trained,
                  "parameters": sum(p.numel() for p in model.parameters()), "threads": torch.get_num_threads()}
        (tmp / "eval.json").write_text(json.dumps(report, indent=2) + "\n")
    return report
