"""Data-parallel GRPO throughput: steps/s and tokens/s of a random-weight model on N GPUs, for scaling efficiency.

Why: the paper trains on 8 H100s; what a reproducer needs to know is how much a second (or eighth) GPU buys with
the trainer's own data parallelism (qerl/rl/distributed.py: prompts sharded by whole groups, one gradient
all-reduce per update). Every rank builds the same random-weight model of a Qwen2.5 architecture in the method's
format (qerl.profiling.build), rolls out `--prompts-per-rank` random-token prompts x `--group-size` samples with the
trainer's sampler (qerl.rl.rollout.sample; AQN on for `qerl`), draws seeded random 0/1 rewards, and runs the
trainer's update (qerl.rl.trainer.policy_update). Each phase is timed between torch.cuda.synchronize() calls and a
barrier; a step lasts as long as its slowest rank.

    torchrun --nproc_per_node 1 -m qerl.profiling.ddp --arch 7B --method qerl --out results/measured/h200/ddp
    torchrun --nproc_per_node 2 -m qerl.profiling.ddp --arch 7B --method qerl --out results/measured/h200/ddp

Each run appends one row to OUT/ddp.csv (arch, method, rank, world_size, global_prompts, group_size,
completion_tokens, step_s, rollout_s, update_s, tokens_per_s, peak_gb: means over the steps after `--warmup`;
tokens = completion tokens sampled by all ranks) and writes OUT/ddp_<arch>_<method>_w<N>.json with every step and
the provenance. Scaling efficiency = tokens_per_s(N GPUs) / (N x tokens_per_s(1 GPU)) at the same per-rank batch.

Deviations from a real run: random weights and random-token prompts (speed and memory depend on the shapes only);
completions run to `--completion` tokens unless the random model samples an EOS (rare: 1 in ~150k per token);
rewards are random, so every group has a non-zero advantage and every update runs.
"""
from __future__ import annotations

import argparse
import contextlib
import csv
import json
import os
import resource
import sys
import time
import zlib
from pathlib import Path

import torch

from qerl.cli import parse_args

__all__ = ["RandomPromptTokenizer", "main"]

COLUMNS = ("arch", "method", "rank", "world_size", "global_prompts", "group_size", "completion_tokens", "step_s",
           "rollout_s", "update_s", "tokens_per_s", "peak_gb")


class RandomPromptTokenizer:
    """The part of a tokenizer that `qerl.rl.rollout.sample` uses, for prompts of random tokens.

    A prompt text maps to `prompt_len` token ids drawn from a generator seeded by the text, so a prompt is the same
    tokens on every rank and every run; decoding returns empty strings (rewards here do not read the text).
    """

    def __init__(self, vocab_size: int, prompt_len: int, pad_token_id: int, eos_token_id: int | None = None):
        self.vocab_size, self.prompt_len = vocab_size, prompt_len
        self.pad_token_id, self.eos_token_id = pad_token_id, eos_token_id

    def __len__(self) -> int:
        return self.vocab_size

    def __call__(self, texts: list[str], return_tensors: str = "pt", **_) -> dict[str, torch.Tensor]:
        rows = [torch.randint(0, self.vocab_size, (self.prompt_len,),
                              generator=torch.Generator().manual_seed(zlib.crc32(t.encode()))) for t in texts]
        ids = torch.stack(rows)  # [N, P]
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return ""

    def batch_decode(self, ids, skip_special_tokens: bool = True) -> list[str]:
        return [""] * len(ids)


def _settings(args, world: int):
    """The trainer's settings for this benchmark: GRPO with the paper's Table 4 values (no config file, so the run
    needs nothing beyond torch, transformers and peft on the GPU machine)."""
    from qerl.methods import get_method
    from qerl.rl.trainer import RunSettings

    targets = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
    return RunSettings(
        task="bench", method=args.method, variant="default", seed=0, source="random", levels=(), algorithm="grpo",
        group_size=args.group_size, updates_per_rollout=args.updates_per_rollout, max_new_tokens=args.completion,
        dynamic_sampling=False, overlong_filter=False, steps=args.steps, prompts_per_step=args.prompts_per_rank * world,
        rollout_max_rows=None, lr=1e-5, warmup_steps=0, min_lr_ratio=0.1, weight_decay=0.0, grad_clip=1.0, optimizer="adamw",
        temperature=1.0, top_p=1.0, clip_eps_low=0.2, clip_eps_high=0.28, kl_coef=0.0, format_weight=0.0,
        gradient_checkpointing=args.gradient_checkpointing, checkpoint_every=args.steps, max_bad_steps=args.steps,
        lora_rank=args.rank, lora_alpha=2.0 * args.rank, lora_dropout=0.0, lora_targets=targets,
        aqn=get_method(args.method).aqn, aqn_schedule="exponential", sigma_start=1e-2, sigma_end=5e-4, aqn_stages=2,
        aqn_resample="step", instruction="none")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _peak_bytes(device: torch.device) -> float:
    if device.type == "cuda":
        return float(torch.cuda.max_memory_allocated(device))
    return float(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--arch", default="7B", help="a Qwen2.5 size of qerl.profiling.archs.ARCHS")
    parser.add_argument("--method", default="qerl", help="a trained method of qerl/methods.py")
    parser.add_argument("--rank", type=int, default=32, help="LoRA rank")
    parser.add_argument("--layers", type=int, default=None, help="decoder layers (default: the architecture's)")
    parser.add_argument("--prompts-per-rank", type=int, default=4, help="prompts each rank rolls out per step")
    parser.add_argument("--group-size", type=int, default=8, help="samples per prompt (G)")
    parser.add_argument("--prompt", type=int, default=128, help="prompt length in tokens (as `qerl profile --prompt`)")
    parser.add_argument("--completion", type=int, default=256, help="completion budget in tokens")
    parser.add_argument("--updates-per-rollout", type=int, default=1, help="optimizer steps per rollout batch")
    parser.add_argument("--steps", type=int, default=3, help="steps, warmup included")
    parser.add_argument("--warmup", type=int, default=1, help="first steps left out of the means")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    parser.add_argument("--no-gradient-checkpointing", dest="gradient_checkpointing", action="store_false",
                        help="keep activations instead of recomputing them (more memory)")
    parser.add_argument("--out", required=True, help="folder of ddp.csv and the per-run JSON")


def run(args) -> dict:
    """Profile and (rank 0) write the results; returns the summary row.

    Raises:
        ValueError: warmup leaves no measured step, or an unknown arch/method.
    """
    from qerl.noise import AdaptiveQuantizationNoise, NoiseSchedule
    from qerl.profiling.build import build_random_model
    from qerl.provenance import provenance
    from qerl.rl.distributed import barrier, broadcast_params, init_distributed, reduce_max, reduce_sum, shutdown
    from qerl.rl.losses import group_advantages
    from qerl.rl.rollout import sample, sequence_logprobs
    from qerl.rl.trainer import UpdateBatch, _lr_lambda, _optimizer, policy_update

    if args.steps <= args.warmup:
        raise ValueError(f"--steps {args.steps} must exceed --warmup {args.warmup}: no step would be measured")
    ctx = init_distributed()
    try:
        device = ctx.device or torch.device("cuda" if torch.cuda.is_available() else "cpu")
        s = _settings(args, ctx.world_size)
        model = build_random_model(args.arch, args.method, rank=args.rank, layers=args.layers, device=device,
                                   dtype=getattr(torch, args.dtype), seed=0)
        if s.gradient_checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            if hasattr(model, "enable_input_require_grads"):
                model.enable_input_require_grads()
        trainable = [p for p in model.parameters() if p.requires_grad]
        broadcast_params(ctx, trainable)
        opt = _optimizer(trainable, s)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, _lr_lambda(s))
        aqn = None
        if s.aqn:
            aqn = AdaptiveQuantizationNoise(NoiseSchedule(s.steps, s.aqn_stages, s.sigma_start, s.sigma_end,
                                                          s.aqn_schedule), seed=s.seed, resample=s.aqn_resample)
        cfg = model.config
        tok = RandomPromptTokenizer(cfg.vocab_size, args.prompt, pad_token_id=cfg.pad_token_id or 0)
        G, per_rank = args.group_size, args.prompts_per_rank
        rows = []
        for step in range(args.steps):
            prompts = [f"step{step}-prompt{ctx.rank * per_rank + i}" for i in range(per_rank)]
            gen = torch.Generator(device=device).manual_seed(1_000_003 * step + ctx.rank)
            _sync(device)
            barrier(ctx)
            t0 = time.perf_counter()
            with aqn.applied(model, step, device) if aqn else contextlib.nullcontext(0.0):
                batch = sample(model, tok, prompts, group_size=G, max_new_tokens=args.completion,
                               temperature=1.0, generator=gen, stop_strings=())
            _sync(device)
            t1 = time.perf_counter()
            rewards = (torch.rand(per_rank * G, generator=torch.Generator().manual_seed(step * 7919 + ctx.rank))
                       < 0.5).float()  # [n]
            adv = group_advantages(rewards, G).to(device)  # [n]
            P = batch.prompt_len
            mask = batch.completion_mask[:, P:].float()  # [n, L]
            with torch.no_grad():
                old = sequence_logprobs(model, batch.input_ids, batch.attention_mask, P)[0] \
                    if s.updates_per_rollout > 1 else None
            policy_update(model, opt, sched, trainable, s,
                          UpdateBatch(batch.input_ids, batch.attention_mask, P, mask, adv, old, None,
                                      ctx.rank * per_rank * G, ctx.world_size * per_rank * G), step, ctx)
            _sync(device)
            t2 = time.perf_counter()
            tokens, = reduce_sum(ctx, [float(batch.lengths.sum())])
            rollout_s, update_s, step_s, peak = reduce_max(ctx, [t1 - t0, t2 - t1, t2 - t0, _peak_bytes(device)])
            rows.append({"step": step, "step_s": step_s, "rollout_s": rollout_s, "update_s": update_s,
                         "tokens": tokens, "tokens_per_s": tokens / step_s, "peak_gb": peak / 1e9})
            if ctx.is_main:
                print(json.dumps(rows[-1]), flush=True)
        checksum = float(sum(p.detach().double().sum() for p in trainable))
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
            detail = {"summary": summary, "steps": rows, "args": vars(args),
                      "layers": args.layers or cfg.num_hidden_layers, "prompt_len": args.prompt,
                      "device": str(device), "backend": ctx.backend, "replicas_in_sync": in_sync,
                      "nccl_nvls_enable": os.environ.get("NCCL_NVLS_ENABLE"), "provenance": provenance()}
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
