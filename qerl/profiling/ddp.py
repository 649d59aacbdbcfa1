"""Data-parallel GRPO throughput: steps/s and tokens/s of a random-weight model on N GPUs, for scaling efficiency.

Why: the paper trains on 8 H100s; what a reproducer needs to know is how much a second (or eighth) GPU buys with
the trainer's own data parallelism (qerl/rl/distributed.py: prompts sharded by whole groups, one gradient
all-reduce per update). Every rank builds the same random-weight model of a Qwen2.5 architecture (qerl.profiling.
build) through the policy core with the settings of a training run (--config / --task, default config/paper.yaml's
first GRPO task: optimizer, schedule, LoRA alpha, clip, AQN), and runs the trainer's own step,
`qerl.rl.step.rl_step`, on `--prompts-per-rank` random-token prompts x `--group-size` samples with seeded random 0/1
rewards (qerl/profiling/e2e.py). A step is timed between torch.cuda.synchronize() calls and a barrier; it lasts as
long as its slowest rank.

    torchrun --nproc_per_node 1 -m qerl.profiling.ddp --arch 7B --method qerl --out results/measured/h200/ddp
    torchrun --nproc_per_node 2 -m qerl.profiling.ddp --arch 7B --method qerl --out results/measured/h200/ddp

Each run appends one row to OUT/ddp.csv (arch, method, rank, world_size, global_prompts, group_size,
completion_tokens, step_s, rollout_s, update_s, tokens_per_s, peak_gb: means over the steps after `--warmup`;
rollout_s = the slowest rank's rollout, update_s = its log-probs and updates; tokens = completion tokens sampled by
all ranks) and writes OUT/ddp_<arch>_<method>_w<N>.json with every step and the provenance. Scaling efficiency =
tokens_per_s(N GPUs) / (N x tokens_per_s(1 GPU)) at the same per-rank batch.

Deviations from a real run: random weights and random-token prompts (speed and memory depend on the shapes only);
completions run to `--completion` tokens unless the random model samples an EOS (rare: 1 in ~150k per token);
rewards are random, so every group has a non-zero advantage and every update runs. `--updates-per-rollout` and
the gradient checkpointing default to the task's and the config's (the committed ddp.csv of run 7 used one update
per rollout).
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch

from qerl.args import parse_args

__all__ = ["main", "add_arguments", "run"]

COLUMNS = ("arch", "method", "rank", "world_size", "global_prompts", "group_size", "completion_tokens", "step_s",
           "rollout_s", "update_s", "tokens_per_s", "peak_gb")
_REPO = Path(__file__).resolve().parents[2]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--arch", default="7B", help="a Qwen2.5 size of qerl.profiling.archs.ARCHS")
    parser.add_argument("--method", default="qerl", help="a trained method of qerl/contract/methods.py")
    parser.add_argument("--rank", type=int, default=32, help="LoRA rank (alpha scaled as the rank<r> variant does)")
    parser.add_argument("--layers", type=int, default=None, help="decoder layers (default: the architecture's)")
    parser.add_argument("--prompts-per-rank", type=int, default=4, help="prompts each rank rolls out per step")
    parser.add_argument("--group-size", type=int, default=8, help="samples per prompt (G)")
    parser.add_argument("--prompt", type=int, default=128, help="prompt length in tokens (as `qerl profile --prompt`)")
    parser.add_argument("--completion", type=int, default=256, help="completion budget in tokens")
    parser.add_argument("--updates-per-rollout", type=int, default=None,
                        help="optimizer steps per rollout batch (default: the task's)")
    parser.add_argument("--steps", type=int, default=3, help="steps, warmup included")
    parser.add_argument("--warmup", type=int, default=1, help="first steps left out of the means")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    parser.add_argument("--no-gradient-checkpointing", dest="gradient_checkpointing", action="store_false",
                        help="keep activations instead of recomputing them (more memory)")
    parser.add_argument("--config", default=str(_REPO / "config" / "paper.yaml"),
                        help="training config whose settings the step uses (default: config/paper.yaml)")
    parser.add_argument("--task", default=None, help="the train.tasks entry of --config (default: its first GRPO task)")
    parser.add_argument("--out", required=True, help="folder of ddp.csv and the per-run JSON")


def run(args) -> dict:
    """Profile and (rank 0) write the results; returns the summary row.

    Raises:
        ValueError: warmup leaves no measured step, an unknown arch/method/task, or a bad config.
    """
    from qerl.config import load_config
    from qerl.contract.methods import get_method
    from qerl.profiling.build import random_base
    from qerl.profiling.e2e import RandomPromptTokenizer, RandomRewards, default_task, profile_settings
    from qerl.provenance import provenance
    from qerl.rl.distributed import barrier, init_distributed, reduce_max, shutdown
    from qerl.rl.settings import build_run_policy
    from qerl.rl.step import StepBatch, make_learner, rl_step

    if args.steps <= args.warmup:
        raise ValueError(f"--steps {args.steps} must exceed --warmup {args.warmup}: no step would be measured")
    cfg = load_config(args.config, check_data=False)
    task = args.task or default_task(cfg)
    ctx = init_distributed()
    try:
        device = ctx.device or torch.device("cuda" if torch.cuda.is_available() else "cpu")
        G, per_rank = args.group_size, args.prompts_per_rank
        s = profile_settings(cfg, task, args.method, rank=args.rank, batch=G, completion=args.completion,
                             prompts=per_rank * ctx.world_size)
        s = replace(s, steps=args.steps, gradient_checkpointing=args.gradient_checkpointing,
                    updates_per_rollout=args.updates_per_rollout or s.updates_per_rollout)
        base = random_base(args.arch, get_method(args.method).weights, layers=args.layers, device=device,
                           dtype=getattr(torch, args.dtype), seed=0)
        mcfg = base.config
        tok = RandomPromptTokenizer(mcfg.vocab_size, args.prompt, pad_token_id=mcfg.pad_token_id or 0)
        learner = make_learner(build_run_policy(s, base, tokenizer=tok), s, ctx)
        rewards = RandomRewards(seed=ctx.rank)
        rows = []
        for step in range(args.steps):
            prompts = [f"step{step}-prompt{ctx.rank * per_rank + i}" for i in range(per_rank)]
            _sync(device)
            barrier(ctx)
            t0 = time.perf_counter()
            row = rl_step(learner, StepBatch(step, prompts, ["0"] * per_rank, ctx.rank * per_rank * G,
                                             ctx.world_size * per_rank * G), s, ctx, reward_fn=rewards)
            _sync(device)
            step_s, = reduce_max(ctx, [time.perf_counter() - t0])
            tokens = float(row.rollout_tokens)  # every rank's (rl_step reduces over ranks)
            rows.append({"step": step, "step_s": step_s, "rollout_s": row.time_rollout,
                         "update_s": row.time_logprobs + row.time_update, "tokens": tokens,
                         "tokens_per_s": tokens / step_s, "peak_gb": row.peak_memory_bytes / 1e9})
            if ctx.is_main:
                print(json.dumps(rows[-1]), flush=True)
        checksum = float(sum(p.detach().double().sum() for p in learner.trainable))
        hi, neg_lo = reduce_max(ctx, [checksum, -checksum])
        in_sync = hi == -neg_lo  # every rank holds the same weights after the updates
        measured = rows[args.warmup:]
        mean = lambda k: sum(r[k] for r in measured) / len(measured)  # noqa: E731
        summary = {"arch": args.arch, "method": args.method, "rank": args.rank, "world_size": ctx.world_size,
                   "global_prompts": per_rank * ctx.world_size, "group_size": G,
                   "completion_tokens": args.completion, "step_s": mean("step_s"), "rollout_s": mean("rollout_s"),
                   "update_s": mean("update_s"), "tokens_per_s": mean("tokens_per_s"),
                   "peak_gb": max(r["peak_gb"] for r in measured)}
        if ctx.is_main:
            out = Path(args.out)
            out.mkdir(parents=True, exist_ok=True)
            table = out / "ddp.csv"
            new = not table.exists()
            with open(table, "a", newline="") as f:
                w = csv.DictWriter(f, fieldnames=COLUMNS)
                if new:
                    w.writeheader()
                w.writerow({k: (f"{v:.4f}" if isinstance(v, float) else v) for k, v in summary.items()})
            detail = {"summary": summary, "steps": rows, "args": vars(args), "task": task,
                      "settings": s.__dict__, "layers": args.layers or mcfg.num_hidden_layers,
                      "prompt_len": args.prompt, "device": str(device), "backend": ctx.backend,
                      "replicas_in_sync": in_sync, "nccl_nvls_enable": os.environ.get("NCCL_NVLS_ENABLE"),
                      "provenance": provenance()}
            name = f"ddp_{args.arch}_{args.method}_w{ctx.world_size}.json"
            (out / name).write_text(json.dumps(detail, indent=2, default=str) + "\n")
        return summary
    finally:
        shutdown(ctx)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m qerl.profiling.ddp", description=__doc__.splitlines()[0])
    add_arguments(parser)
    args = parse_args(parser, sys.argv[1:] if argv is None else list(argv), {"--prompt-len": "--prompt"})
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    run(args)
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
