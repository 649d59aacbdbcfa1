"""RL training of every method of the paper: the run loop around one GRPO / DAPO step.

One flat loop (no trainer class hierarchy). The run's policy comes from the policy core (qerl/policy: the method's
weights and format, its LoRA adapters or every weight, AQN), its optimizer and schedule from the run's settings
(qerl/rl/settings.py); each step then
  1. takes `prompts_per_step` problems (a deterministic function of seed and step, stratified by level) and builds
     the paper's prompt of each;
  2. runs `rl_step` (qerl/rl/step.py): G samples per prompt under the step's AQN noise, rewards, group-normalised
     advantages, log-probs and `updates_per_rollout` optimizer steps; it returns the step's metrics;
  3. appends them to metrics.jsonl (one qerl.contract.records.MetricsRow per line) and to the trackers of
     train.report_to (qerl/rl/trackers.py); on the steps train.rollout_samples keeps, writes the completions of a
     share of the prompts to rollouts/step<k>.jsonl.gz (qerl/rl/rollout_log.py); every `checkpoint_every` steps
     writes a resumable checkpoint (qerl/rl/resume.py).
Methods (qerl/contract/methods.py): full (all weights trainable), lora (BF16 base), qlora (bitsandbytes NF4 base),
mxfp4_lora, nvfp4_lora (QeRL without AQN), qerl (NVFP4 + AQN). Variants (qerl/contract/variants.py): default,
noaqn, aqn-<schedule> (on any method), rank<r>, lr<value>, tis<C> (truncated importance sampling), norms (RMSNorm
weights trained too). Every step logs the rollout-train mismatch (qerl/rl/mismatch.py): how far the sampler's token
log-probs (AQN noise, engine rounding) are from the clean policy's that the update uses.

Resume: sampling, data order and AQN noise are seeded by (seed, step), and the checkpoint holds the trainable
weights, optimizer and scheduler state and the metrics history, so a killed run continues identically and rewrites
metrics.jsonl in full (qerl/rl/resume.py says when a checkpoint is ignored), drops the rollout chunks of the steps
it runs again, and logs the history to fresh trackers. A NaN/Inf loss skips its update;
`max_bad_steps` in a row abort with a clear message.

Data parallelism (qerl/rl/distributed.py): under `torchrun --nproc_per_node N` or `accelerate launch` each rank
takes a contiguous slice of the step's prompts (a prompt's G samples stay on one rank, so advantages and dynamic
sampling are per-rank computations), rolls them out with its own generator (rank 0's is the single process's),
and the update sums the ranks' gradients with the loss normalised over the global batch, so the update equals one
process's on the same global batch up to float reduction order (tests/rl/test_distributed.py). Metrics are reduced
over ranks; rank 0 alone writes metrics.jsonl, checkpoints, the adapter and run.json. Deviation: N ranks draw
different rollouts than one process (each rank samples its slice with its own generator), so an N-GPU run is
statistically, not bitwise, the one-GPU run. Full fine-tuning is replicated, not FSDP (why: distributed.py's
docstring). With a process group the policy is built on the rank's device (cuda:<local rank>); without one,
`device` picks it.

Run: `qerl train ...` (qerl/commands/train.py: this loop, then the evaluation of the trained policy); in Python
`train(cfg, resolve_settings(cfg, task, method, variant, seed), base_dir, out_dir)`.
"""
from __future__ import annotations

import itertools
import json
import random
import shutil
import time
from dataclasses import asdict
from pathlib import Path

import torch

from qerl.contract.paths import ADAPTER_DIR, CHECKPOINT_FILE, FULL_MODEL_DIR, METRICS_FILE, RUN_INFO_FILE, tiny_split
from qerl.contract.paths import root_of, run_name
from qerl.contract.records import MetricsRow
from qerl.data.prompts import build_prompt
from qerl.io import write_json
from qerl.provenance import provenance
from qerl.readout import Readout
from qerl.rl.distributed import DistContext, all_gather_list, barrier, init_distributed, shard_range
from qerl.rl.resume import resume, run_identity, save_checkpoint
from qerl.rl.rollout_log import RolloutKeep, drop_from, rollout_keep, write_chunk
from qerl.rl.settings import RunSettings, build_run_policy
from qerl.rl.step import StepBatch, make_learner, rl_step
from qerl.rl.trackers import Trackers, open_trackers

__all__ = ["load_task_problems", "batch_indices", "train"]


def load_task_problems(cfg: dict, s: RunSettings, data_dir: str | Path | None = None) -> list:
    """Training problems of the task: the tiny RL split, GSM8K train, or the MATH training split (BigMath stand-in).

    Raises:
        ValueError: a missing or malformed data file (naming it and the line).
    """
    from qerl.data.benchmarks import load_benchmark, load_jsonl_problems

    levels = list(s.levels) or None
    if s.source == "tiny":
        path = Path(data_dir) / "rl.jsonl" if data_dir else Path(tiny_split(root_of(cfg), "rl"))
        return load_jsonl_problems(path, "tiny", levels=levels)
    return load_benchmark(s.source, cfg["data"]["root"], split="train", levels=levels)


def _epoch_order(levels: list, seed: int, epoch: int) -> list[int]:
    """One epoch's order of the problems, stratified by level: each level's problems are shuffled (seeded by seed
    and epoch) and the levels then take turns, so every consecutive slice holds the levels in equal shares. With
    one level (or none, as GSM8K) this is a plain seeded permutation."""
    rng = random.Random(f"{seed}:epoch{epoch}")
    strata: dict = {}
    for i, level in enumerate(levels):
        strata.setdefault(level, []).append(i)
    queues = []
    for key in sorted(strata, key=lambda k: (k is None, k)):
        rng.shuffle(strata[key])
        queues.append(strata[key])
    return [i for turn in itertools.zip_longest(*queues) for i in turn if i is not None]


def batch_indices(levels: list, seed: int, step: int, size: int) -> list[int]:
    """Problems of a step: consecutive slices of per-epoch orders (_epoch_order) seeded by (seed, epoch); stateless.

    Why stratified: a step of 16 prompts drawn at random from levels 1-3 has a level mix that swings its mean reward
    by more than RL moves it in 16 steps (the curves of every method rose and fell together with the prompts); the
    paper's 128-prompt batches average that out. Equal shares per level keep the batch's difficulty steady.
    """
    n = len(levels)
    out, pos = [], step * size
    while len(out) < size:
        epoch, offset = divmod(pos, n)
        take = _epoch_order(levels, seed, epoch)[offset : offset + size - len(out)]
        out += take
        pos += len(take)
    return out


def train(cfg: dict, s: RunSettings, base_dir: str | Path, out_dir: str | Path, *, quantized_dir=None,
          data_dir=None, stop_after: int | None = None, progress: bool = True, dist_ctx: DistContext | None = None,
          device: str | torch.device | None = None) -> dict:
    """Train one run into `out_dir` (resuming from its checkpoint if there is one).

    Under torchrun / accelerate launch (or with `dist_ctx`) each rank rolls out a contiguous slice of the step's
    prompts (whole groups), gradients are summed over ranks with the global loss normalisation (rl_step), metrics
    are reduced over ranks, and rank 0 alone writes files.

    Args:
        cfg: validated config.
        s: the run's settings (qerl.rl.settings.resolve_settings).
        base_dir: the base model checkpoint folder.
        out_dir: the run folder (metrics.jsonl, checkpoint.pt, adapter/ or model/, run.json).
        quantized_dir: the quantized checkpoint of the method's format (else round-to-nearest on load).
        data_dir: folder of the tiny scale's generated data (default results/<scale>/data/tiny).
        stop_after: stop (as if killed) after this many steps, leaving the checkpoint; for resume tests.
        progress: show a progress bar with the live reward (rank 0).
        dist_ctx: the distributed context (default: qerl.rl.distributed.init_distributed(), from the environment).
        device: where a single process trains (None: the CPU); ranks use their own.

    Returns:
        {"steps": steps done, "final": the last step's metrics (a dict; {} when no step ran), "policy", "model",
         "tokenizer", "seconds": {"setup": data, policy, optimizer and checkpoint before the first step, "steps": the
         step loop of this call, "save": the trained weights}}.

    Raises:
        RuntimeError: `max_bad_steps` consecutive non-finite losses.
        ValueError: fewer prompts per step than ranks; bad inputs (as build_policy and the data loaders).
    """
    t0 = time.perf_counter()
    ctx = init_distributed() if dist_ctx is None else dist_ctx
    if ctx.distributed:
        shard_range(s.prompts_per_step, ctx.rank, ctx.world_size)  # fail before loading anything
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(s.seed)
    problems = load_task_problems(cfg, s, data_dir)
    policy = build_run_policy(s, base_dir, quantized=quantized_dir, dtype=cfg["model"]["dtype"],
                              device=ctx.device if ctx.device is not None else device,
                              nf4_decode=cfg["model"]["nf4_decode"])
    learner = make_learner(policy, s, ctx)
    ckpt, metrics_path = out / CHECKPOINT_FILE, out / METRICS_FILE
    identity = run_identity(s, problems, base_dir, quantized_dir)
    start, bad, history = resume(ckpt, metrics_path, learner, identity, s.steps, ctx.is_main)
    keep = rollout_keep(cfg, s.steps)
    trackers = Trackers([])
    if ctx.is_main:
        drop_from(out, start, keep)
        info = {"settings": s.__dict__, "provenance": provenance()}
        if ctx.distributed:
            info["distributed"] = {"world_size": ctx.world_size, "backend": ctx.backend}
        write_json(out / RUN_INFO_FILE, info, default=list)
        trackers = open_trackers(cfg["train"]["report_to"], run_dir=out, root=root_of(cfg), scale=cfg["scale"],
                                 run_name=run_name(s.task, cfg["model"]["name"], s.method, s.variant, s.seed),
                                 config=cfg, info=info,
                                 history=[MetricsRow.parse(json.loads(l), f"{ckpt}: history") for l in history])
    setup = time.perf_counter() - t0
    try:
        return _run_steps(s, out, policy, learner, problems, ctx, start, bad, history, identity, keep, trackers,
                          stop_after, progress, setup)
    finally:
        trackers.close()


def _run_steps(s: RunSettings, out: Path, policy, learner, problems: list, ctx: DistContext, start: int, bad: int,
               history: list[str], identity: dict, keep: RolloutKeep, trackers: Trackers, stop_after: int | None,
               progress: bool, setup: float) -> dict:
    """The step loop of `train` from step `start`, then the trained weights (train's docstring); `setup`: the
    seconds before the loop (reported in the log and in the result's "seconds")."""
    ckpt, metrics_path = out / CHECKPOINT_FILE, out / METRICS_FILE
    G, last = s.group_size, {}
    levels = [p.level for p in problems]
    bar = Readout(s.steps, start, f"{s.task}/{s.method}/{s.variant}/seed{s.seed}", enabled=progress and ctx.is_main)
    bar.note(f"set up in {setup:.1f} s (data, policy, optimizer, checkpoint)")
    t_loop = time.perf_counter()
    for step in range(start, s.steps):
        if stop_after is not None and step >= stop_after:
            break
        indices = batch_indices(levels, s.seed, step, s.prompts_per_step)
        lo, hi = shard_range(len(indices), ctx.rank, ctx.world_size) if ctx.distributed else (0, len(indices))
        chosen = [problems[i] for i in indices[lo:hi]]  # this rank's prompts: whole groups
        prompts = [build_prompt(p.question, policy.tokenizer, s.instruction) for p in chosen]
        samples = [] if keep.keeps(step) else None
        row = rl_step(learner, StepBatch(step, prompts, [p.answer for p in chosen], lo * G, len(indices) * G,
                                         [p.id for p in chosen]), s, ctx, samples=samples)
        if samples is not None:  # the first keep.prompts(...) prompts of the global batch, every rank's share
            kept = all_gather_list(ctx, samples[:max(0, keep.prompts(len(indices)) - lo) * G])
            if ctx.is_main:
                write_chunk(out, step, kept)
        bad = bad + 1 if row.skipped_updates else 0
        if bad >= s.max_bad_steps:
            raise RuntimeError(f"{bad} consecutive steps had a NaN/Inf loss (last at step {step}); lower train.lr "
                               f"(now {s.lr}) or check the model; the last good checkpoint is {ckpt}")
        last = asdict(row)
        history.append(row.to_json())
        if ctx.is_main:
            with open(metrics_path, "a") as f:
                f.write(history[-1] + "\n")
            trackers.log(row)
        bar.step(reward=row.reward, entropy=row.entropy, length=row.response_length, mixed=row.mixed_groups,
                 **({"sigma": row.sigma} if s.aqn else {}))
        if ((step + 1) % s.checkpoint_every == 0 or step + 1 == s.steps) and ctx.is_main:
            save_checkpoint(ckpt, learner, step + 1, bad, history, identity)
    bar.close()
    seconds = {"setup": round(setup, 2), "steps": round(time.perf_counter() - t_loop, 2)}
    result = {"steps": s.steps, "final": last, "policy": policy, "model": policy.model,
              "tokenizer": policy.tokenizer, "seconds": seconds}
    if stop_after is not None and stop_after < s.steps:
        if ctx.is_main:
            save_checkpoint(ckpt, learner, len(history), bad, history, identity)
        barrier(ctx)
        return {**result, "steps": stop_after}
    t_save = time.perf_counter()
    if ctx.is_main:
        full = policy.method.trainable == "all"
        weights_dir = out / (FULL_MODEL_DIR if full else ADAPTER_DIR)
        shutil.rmtree(weights_dir, ignore_errors=True)
        if full and policy.method.weights == "bf16":
            policy.model.save_pretrained(weights_dir)
            policy.tokenizer.save_pretrained(weights_dir)
        elif not full:
            policy.model.save_pretrained(weights_dir)
    barrier(ctx)
    seconds["save"] = round(time.perf_counter() - t_save, 2)
    return result
