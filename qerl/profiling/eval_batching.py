"""An evaluation's time with fixed batches against continuous batching (qerl.evaluate.stream), same model and prompts.

    python -m qerl.profiling.eval_batching --model results/small/models/smollm2-135m/base --data resources/data \
        --benchmark gsm8k --batch 128 --max-new 512 --out results/eval_batching.json        (a GPU)

Each mode samples one completion per problem of the benchmark (the paper's instruction in the model's chat template,
T 0.6, top-p 0.95, stop at </answer>, as the DAG's evaluations) and is timed end to end; the report gives seconds,
pass@1 (the project's grader) with its binomial SE, how each completion ended and its mean length, so the speed-up
can be read beside evidence that the two modes sample the same distribution (their pass@1 and lengths agree within
noise; the draws differ).
"""
from __future__ import annotations

import argparse
import json
import math
import time
from collections import Counter
from pathlib import Path

import torch

__all__ = ["main"]


def _mode(model, tokenizer, prompts, problems, args, continuous: bool, refill_below: float | None) -> dict:
    from qerl.evaluate.lm import sample
    from qerl.rl.rewards import accuracy_reward

    device = next(model.parameters()).device
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    gen = torch.Generator(device=device).manual_seed(args.seed)
    sync()
    t0 = time.perf_counter()
    outs = sample(model, tokenizer, prompts, max_new_tokens=args.max_new, temperature=0.6, top_p=0.95,
                  stop=("</answer>",), generator=gen, batch_size=args.batch, continuous=continuous,
                  refill_below=refill_below)
    sync()
    seconds = time.perf_counter() - t0
    right = [accuracy_reward(o.text, p.answer) for o, p in zip(outs, problems)]
    acc = sum(right) / len(right)
    return {"mode": f"continuous {refill_below}" if continuous else "fixed batches", "seconds": round(seconds, 2),
            "pass_at_1": round(100 * acc, 2), "stderr": round(100 * math.sqrt(acc * (1 - acc) / len(right)), 2),
            "finish": dict(Counter(o.finish for o in outs)),
            "mean_tokens": round(sum(o.n_tokens for o in outs) / len(outs), 1)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="a converted checkpoint folder (qerl prepare-model / sft)")
    ap.add_argument("--data", required=True, help="the data root (<root>/<benchmark>/test.jsonl)")
    ap.add_argument("--benchmark", default="gsm8k")
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--max-new", type=int, default=512)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--limit", type=int, help="the first N problems only")
    ap.add_argument("--refill-below", type=float, nargs="+", default=[0.25],
                    help="continuous batching's refill fractions to time (each its own row)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    from qerl.data.benchmarks import load_benchmark
    from qerl.data.prompts import build_prompt
    from qerl.policy.core import load_base

    model, tokenizer = load_base(args.model, "bfloat16" if args.device == "cuda" else "float32", args.device)
    problems = load_benchmark(args.benchmark, args.data, limit=args.limit)
    prompts = [build_prompt(p.question, tokenizer, "paper") for p in problems]
    _mode(model, tokenizer, prompts[: args.batch], problems[: args.batch], args, True, args.refill_below[0])  # warm-up
    rows = []
    for continuous, below in [(False, None)] + [(True, b) for b in args.refill_below]:
        rows.append(_mode(model, tokenizer, prompts, problems, args, continuous, below))
        print(json.dumps(rows[-1]), flush=True)
    env = {"gpu": torch.cuda.get_device_name() if args.device == "cuda" else "cpu", "torch": torch.__version__}
    tmp = args.out.with_suffix(".tmp")
    tmp.write_text(json.dumps({"environment": env, "settings": vars(args) | {"out": str(args.out)},
                               "n_problems": len(problems), "results": rows,
                               "speedup": round(rows[0]["seconds"] / rows[1]["seconds"], 2)}, indent=1, default=str))
    tmp.replace(args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
