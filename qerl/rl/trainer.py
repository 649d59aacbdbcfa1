"""RL training of every method of the paper: GRPO or DAPO on one model that serves rollouts and log-probs.

One flat loop (no trainer class hierarchy). Each step:
  1. take `prompts_per_step` problems (a deterministic function of seed and step), build the paper's prompt;
  2. sample G completions per prompt from the policy; for AQN methods the RMSNorm weights carry Gaussian noise of the
     schedule's sigma during the rollout only (qerl.noise), restored bit-exactly before any log-prob is computed;
  3. grade them (qerl.rl.rewards, math-verify), compute group-normalised advantages; DAPO may drop groups whose
     rewards are all equal (dynamic sampling) and mask truncated completions (overlong filtering);
  4. `updates_per_rollout` optimizer steps over disjoint minibatches of the rollout (several = off-policy, as for
     GSM8K; one = on-policy, as for BigMath); old log-probs are the clean pre-update policy's; the KL reference
     (GRPO, kl_coef > 0) is the same model with its adapters disabled, so no second copy of the weights exists;
  5. append the step's metrics to metrics.jsonl; every `checkpoint_every` steps write a resumable checkpoint.
Methods (qerl/methods.py): full (all weights trainable), lora (BF16 base), qlora (bitsandbytes NF4 base), mxfp4_lora,
nvfp4_lora (QeRL without AQN), qerl (NVFP4 + AQN). Variants (qerl/rl/variants.py): default, noaqn, aqn-<schedule>
(on any method), rank<r>, lr<value>, tis<C> (truncated importance sampling), norms (RMSNorm weights trained too).
Every step logs the rollout-train mismatch (qerl/rl/mismatch.py): how far the sampler's token log-probs (AQN noise,
engine rounding) are from the clean policy's that the update uses.

Resume: sampling, data order and AQN noise are seeded by (seed, step), and the checkpoint holds the trainable
weights, optimizer and scheduler state, so a killed run continues identically (tests/rl/test_trainer.py). The
checkpoint also holds every metrics line written before its step, and on resume metrics.jsonl is rewritten from
it: Snakemake deletes metrics.jsonl (a declared output) when a job fails or is rerun as incomplete, while
checkpoint.pt (deliberately not an output) survives, so the resumed job still writes the whole history. A
checkpoint written for other settings or other input files (base model, quantized checkpoint, training problems)
is ignored: the run starts from step 0, as the rerun Snakemake started for that change expects. A resumed run says
so, and from which step, on stderr (the job's log).
A NaN/Inf loss skips its update; `max_bad_steps` in a row abort with a clear message.

Deviations from the paper (which trains with verl + vLLM): rollouts use our own sampler on the training model (no
vLLM); the minibatch split of an off-policy step is over rows of the rollout batch in a seeded order; ratio clipping
for GRPO uses clip_eps_low on both sides, DAPO uses clip_eps_low/clip_eps_high.

Data parallelism (qerl/rl/distributed.py): under `torchrun --nproc_per_node N` or `accelerate launch` each rank
takes a contiguous slice of the step's prompts (a prompt's G samples stay on one rank, so advantages and dynamic
sampling are per-rank computations), rolls them out with its own generator (rank 0's is the single process's),
and the update sums the ranks' gradients with the loss normalised over the global batch, so the update equals one
process's on the same global batch up to float reduction order (tests/rl/test_distributed.py). Metrics are reduced
over ranks; rank 0 alone writes metrics.jsonl, checkpoints, the adapter, run.json and eval.json (and evaluates).
Deviation: N ranks draw different rollouts than one process (each rank samples its slice with its own generator),
so an N-GPU run is statistically, not bitwise, the one-GPU run. Full fine-tuning is replicated, not FSDP (why:
distributed.py's docstring). With a process group the model is moved to the rank's device (cuda:<local rank>);
without one, `qerl train --device` picks it (auto: a CUDA GPU when there is one; the DAG passes cpu when
resources.train.gpus is 0).

Run: `qerl train --config config/config.yaml --task tiny_grpo --method qerl --variant default --seed 0
      --base results/tiny/models/tiny/base --out results/tiny/runs/tiny_grpo/tiny/qerl/default/seed0`
     `torchrun --nproc_per_node 2 -m qerl.cli train ...` (same arguments) for two GPUs.
"""
from __future__ import annotations

import contextlib
import copy
import hashlib
import itertools
import json
import math
import random
import resource
import shutil
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from qerl.data.prompts import build_prompt
from qerl.io import atomic_file, write_json, write_text
from qerl.methods import Method, get_method
from qerl.noise import AdaptiveQuantizationNoise, NoiseSchedule
from qerl.noise.aqn import NORM_TARGETS
from qerl.provenance import provenance
from qerl.readout import Readout
from qerl.rl.distributed import (DistContext, all_gather_cat, all_reduce_grads, barrier, broadcast_params,
                                  init_distributed, reduce_max, reduce_sum, shard_range, shutdown)
from qerl.rl.losses import dapo_loss, dynamic_sampling_mask, grpo_loss, group_advantages, overlong_filter
from qerl.rl.mismatch import MISMATCH_KEYS, importance_ratios, tis_weights
from qerl.rl.rewards import compute_rewards
from qerl.rl.rollout import sample, sequence_logprobs
from qerl.rl.variants import VARIANT_FORMS, parse_variant

__all__ = ["RunSettings", "UpdateBatch", "parse_variant", "resolve_settings", "load_task_problems", "build_policy",
           "policy_update", "run_identity", "train", "run"]

METRIC_KEYS = ("step", "reward", "accuracy", "entropy", "sigma", "response_length", "clip_fraction", "kl",
               "grad_norm", "time_rollout", "time_logprobs", "time_update", "peak_memory_bytes")


@dataclass(frozen=True)
class RunSettings:
    """Everything one run needs, resolved from the config, the task, the method and the variant."""

    task: str
    method: str
    variant: str
    seed: int
    source: str
    levels: tuple[int, ...]
    algorithm: str
    group_size: int
    updates_per_rollout: int
    max_new_tokens: int
    dynamic_sampling: bool
    overlong_filter: bool
    steps: int
    prompts_per_step: int
    rollout_max_rows: int | None
    lr: float
    warmup_steps: int
    min_lr_ratio: float
    weight_decay: float
    grad_clip: float
    optimizer: str
    temperature: float
    top_p: float
    clip_eps_low: float
    clip_eps_high: float
    kl_coef: float
    format_weight: float
    gradient_checkpointing: bool
    checkpoint_every: int
    max_bad_steps: int
    lora_rank: int
    lora_alpha: float
    lora_dropout: float
    lora_targets: tuple[str, ...]
    aqn: bool
    aqn_schedule: str
    sigma_start: float
    sigma_end: float
    aqn_stages: int
    aqn_resample: str
    instruction: str
    tis_cap: float = 0.0  # > 0: truncated importance sampling at that cap (variant tis<C>)
    train_norms: bool = False  # the RMSNorm weights trained in full beside LoRA (variant norms)


def resolve_settings(cfg: dict, task: str, method: str, variant: str, seed: int) -> RunSettings:
    """Merge config defaults, the task's settings, the method's learning rate and the variant's overrides.

    Raises:
        ValueError: unknown task (naming the configured ones), method or variant.
    """
    tr = cfg["train"]
    if task not in tr["tasks"]:
        raise ValueError(f"unknown task {task!r}; config key 'train.tasks' defines {sorted(tr['tasks'])}")
    meth = get_method(method)
    if meth.trainable == "none":
        raise ValueError(f"method {method!r} has nothing to train (it is an evaluation-only row)")
    t = tr["tasks"][task]
    settings = RunSettings(
        task=task, method=method, variant=variant, seed=seed, source=t["source"], levels=tuple(t.get("levels", [])),
        algorithm=t["algorithm"], group_size=t.get("group_size", 8), updates_per_rollout=t.get("updates_per_rollout", 1),
        max_new_tokens=t.get("max_new_tokens", 96), dynamic_sampling=t.get("dynamic_sampling", False),
        overlong_filter=t.get("overlong_filter", False), steps=tr["steps"], prompts_per_step=tr["prompts_per_step"],
        rollout_max_rows=tr["rollout_max_rows"], lr=tr["lr_by_method"].get(method, tr["lr"]),
        warmup_steps=tr["warmup_steps"], min_lr_ratio=tr["min_lr_ratio"],
        weight_decay=tr["weight_decay"], grad_clip=tr["grad_clip"], optimizer=tr["optimizer"],
        temperature=tr["temperature"], top_p=tr["top_p"], clip_eps_low=tr["clip_eps_low"],
        clip_eps_high=tr["clip_eps_high"], kl_coef=tr["kl_coef"], format_weight=tr["format_weight"],
        gradient_checkpointing=tr["gradient_checkpointing"], checkpoint_every=tr["checkpoint_every"],
        max_bad_steps=tr["max_bad_steps"], lora_rank=tr["lora"]["rank"], lora_alpha=tr["lora"]["alpha"],
        lora_dropout=tr["lora"]["dropout"], lora_targets=tuple(tr["lora"]["targets"]), aqn=meth.aqn,
        aqn_schedule=tr["aqn"]["schedule"], sigma_start=tr["aqn"]["sigma_start"], sigma_end=tr["aqn"]["sigma_end"],
        aqn_stages=tr["aqn"]["stages"], aqn_resample=tr["aqn"]["resample"], instruction=cfg["prompt"]["instruction"],
    )
    overrides = parse_variant(variant)
    if "lora_rank" in overrides:  # keep the LoRA scale alpha / r fixed across the rank ablation
        overrides["lora_alpha"] = settings.lora_alpha * overrides["lora_rank"] / settings.lora_rank
    if overrides.get("train_norms") and meth.trainable == "all":
        raise ValueError(f"variant {variant!r} trains the RMSNorm weights beside LoRA, but method {method!r} already "
                         "trains every weight")
    return replace(settings, **overrides)


def load_task_problems(cfg: dict, s: RunSettings, data_dir: str | Path | None = None) -> list:
    """Training problems of the task: the tiny RL split, GSM8K train, or the MATH training split (BigMath stand-in)."""
    from qerl.data.benchmarks import load_benchmark, load_jsonl_problems

    levels = list(s.levels) or None
    if s.source == "tiny":
        folder = Path(data_dir or f"{cfg['results_dir']}/{cfg['scale']}/data/tiny")
        return load_jsonl_problems(folder / "rl.jsonl", "tiny", levels=levels)
    return load_benchmark(s.source, cfg["data"]["root"], split="train", levels=levels)


def build_policy(cfg: dict, s: RunSettings, base_dir: str | Path, quantized_dir: str | Path | None = None):
    """Load the base model, put its weights in the method's format, and make the method's parameters trainable.

    Returns:
        (model, tokenizer): a peft model for LoRA methods, the plain model (all weights trainable) for `full`.

    Raises:
        ValueError: unknown dtype; RuntimeError: NF4 where bitsandbytes cannot run.
    """
    from transformers import AutoModelForCausalLM

    from qerl.evaluate.load import load_tokenizer

    meth: Method = get_method(s.method)
    dtype = getattr(torch, cfg["model"]["dtype"])
    tokenizer = load_tokenizer(base_dir)
    if meth.weights != "bf16" and quantized_dir is not None:
        from qerl.quantize.checkpoint import load_quantized

        model = load_quantized(quantized_dir, dtype=dtype)  # AWQ-calibrated NVFP4/MXFP4, or the NF4 recipe
    else:
        model = AutoModelForCausalLM.from_pretrained(base_dir, dtype=dtype)
        if meth.weights in ("nvfp4", "mxfp4"):  # no calibrated checkpoint given: round-to-nearest on load
            from qerl.layers import MXFP4Config, NVFP4Config, quantize_

            quantize_(model, NVFP4Config() if meth.weights == "nvfp4" else MXFP4Config())
        elif meth.weights == "nf4":
            from baselines.nf4 import NF4Config, quantize_nf4_

            quantize_nf4_(model, NF4Config(compute_dtype=dtype))
    if meth.weights == "nf4":
        for module in model.modules():  # bitsandbytes repacks CPU weights on the first no-grad eval forward (the
            if hasattr(module, "support_avx512bf16_for_cpu"):  # rollout), after which its training forward breaks
                module.support_avx512bf16_for_cpu = False  # autograd; keep the trainable layout throughout
    if meth.trainable == "all":
        for p in model.parameters():
            p.requires_grad_(True)
    else:
        import peft

        from qerl.layers.lora import register_quant_linear

        for p in model.parameters():
            p.requires_grad_(False)
        # norms: the official scripts' ln=True (peft modules_to_save: a trainable copy of each RMSNorm, saved with
        # the adapter; AQN perturbs the active copy, qerl.noise.find_norm_weights)
        lcfg = register_quant_linear(peft.LoraConfig(r=s.lora_rank, lora_alpha=s.lora_alpha,
                                                     lora_dropout=s.lora_dropout, target_modules=list(s.lora_targets),
                                                     modules_to_save=list(NORM_TARGETS) if s.train_norms else None,
                                                     bias="none", task_type="CAUSAL_LM"))
        model = peft.get_peft_model(model, lcfg)
    if s.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        if hasattr(model, "enable_input_require_grads"):
            model.enable_input_require_grads()
    return model, tokenizer


def _optimizer(params, s: RunSettings):
    if s.optimizer == "adamw8bit":
        try:
            import bitsandbytes as bnb

            return bnb.optim.AdamW8bit(params, lr=s.lr, weight_decay=s.weight_decay)
        except Exception as exc:  # noqa: BLE001 - report whatever bitsandbytes raised
            raise RuntimeError(f"train.optimizer = adamw8bit, but bitsandbytes' AdamW8bit is unavailable here "
                               f"({exc}); set train.optimizer: adamw") from exc
    return torch.optim.AdamW(params, lr=s.lr, weight_decay=s.weight_decay, betas=(0.9, 0.99))


def _lr_lambda(s: RunSettings):
    total = s.steps * s.updates_per_rollout
    warm = s.warmup_steps * s.updates_per_rollout

    def f(i: int) -> float:
        if i < warm:
            return (i + 1) / warm
        u = min(1.0, (i - warm) / max(1, total - warm))
        return s.min_lr_ratio + (1 - s.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * u))

    return f


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


def _batch_indices(levels: list, seed: int, step: int, size: int) -> list[int]:
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


def _peak_memory() -> int:
    if torch.cuda.is_available():
        return int(torch.cuda.max_memory_allocated())
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def _masked_mean(x: torch.Tensor, mask: torch.Tensor) -> float:
    m = mask.to(x.dtype)
    return float((x * m).sum() / m.sum().clamp(min=1))


def _save_checkpoint(path: Path, model, opt, sched, step: int, bad: int, history: list[str],
                     identity: dict) -> None:
    """Write the resumable state after `step` steps; `history` is the metrics lines of steps 0 .. step - 1."""
    assert len(history) == step, (len(history), step)
    state = {"step": step, "bad_streak": bad, "optimizer": opt.state_dict(), "scheduler": sched.state_dict(),
             "trainable": {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad},
             "history": list(history), "identity": identity}
    with atomic_file(path) as tmp:
        torch.save(state, tmp)


def _load_checkpoint(state: dict, model, opt, sched) -> tuple[int, int]:
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name, value in state["trainable"].items():
            params[name].copy_(value)
    opt.load_state_dict(state["optimizer"])
    sched.load_state_dict(state["scheduler"])
    return state["step"], state["bad_streak"]


def _files_fingerprint(folder: str | Path | None) -> list | None:
    """(relative path, size, mtime in ns) of every file under `folder`: changes when the folder is rewritten, as the
    mtimes Snakemake compares do; reading no file content keeps it cheap for 4-bit checkpoints of 30B models."""
    if folder is None:
        return None
    root = Path(folder)
    return [[str(f.relative_to(root)), f.stat().st_size, f.stat().st_mtime_ns]
            for f in sorted(root.rglob("*")) if f.is_file()]


def run_identity(s: RunSettings, problems: list, base_dir, quantized_dir=None) -> dict:
    """What a checkpoint must match to be resumed: the settings, the base and quantized checkpoints' files and the
    training problems. Anything else (a config edit, a re-pretrained base model) means a new run from step 0."""
    digest = hashlib.sha256("\n".join(f"{p.question}\t{p.answer}" for p in problems).encode()).hexdigest()
    return {"settings": json.loads(json.dumps(s.__dict__, default=list)), "problems_sha256": digest,
            "base": _files_fingerprint(base_dir), "quantized": _files_fingerprint(quantized_dir)}


def _identity_change(old: dict | None, new: dict) -> str | None:
    """What differs between a checkpoint's identity and this run's, in words; None when they match."""
    if old is None:
        return None  # a checkpoint from before identities were recorded: trusted, as it was then
    if old == new:
        return None
    before = old.get("settings") or {}
    changed = [f"{k}: {before.get(k)!r} -> {v!r}" for k, v in new["settings"].items() if before.get(k) != v]
    changed += [f"{k} files" for k in ("base", "quantized") if old.get(k) != new[k]]
    changed += ["training problems"] if old.get("problems_sha256") != new["problems_sha256"] else []
    return ", ".join(changed) or "identity"


def _resume(ckpt: Path, metrics_path: Path, model, opt, sched, identity: dict, total_steps: int,
            is_main: bool) -> tuple[int, int, list[str]]:
    """Load `ckpt` if it belongs to this run and put its metrics history back into metrics.jsonl.

    Returns:
        (first step to run, consecutive bad steps so far, metrics lines of the steps before it).

    Raises:
        ValueError: an old checkpoint that carries no history while metrics.jsonl does not reach its step (the
            history of the steps before it would be lost), naming the files to delete.
    """
    if ckpt.exists():
        state = torch.load(ckpt, map_location="cpu", weights_only=False)
        change = _identity_change(state.get("identity"), identity)
        if change is not None:
            if is_main:
                print(f"qerl train: ignoring {ckpt}: it was written for another run ({change}); training from step 0",
                      file=sys.stderr, flush=True)
        else:
            history = state.get("history")
            start = state["step"]
            if history is None:  # written before checkpoints carried the history: it must still be on disk
                on_disk = [l for l in metrics_path.read_text().splitlines() if l] if metrics_path.exists() else []
                history = [l for l in on_disk if json.loads(l)["step"] < start]
                steps = [json.loads(l)["step"] for l in history]
                if steps != list(range(start)):
                    raise ValueError(
                        f"{ckpt} is at step {start}, but {metrics_path} holds "
                        f"{'no metrics' if not steps else f'steps {steps[0]}-{steps[-1]} ({len(steps)} lines)'} "
                        f"and the checkpoint carries no history: resuming would lose the metrics of steps 0-{start - 1}."
                        f" Delete {ckpt} and {metrics_path} to train this run again from step 0")
            start, bad = _load_checkpoint(state, model, opt, sched)
            if is_main:
                write_text(metrics_path, "".join(line + "\n" for line in history))
                what = "training is complete; saving the weights and evaluating" if start >= total_steps else \
                    f"continuing with step {start}"
                print(f"qerl train: resumed from {ckpt} at step {start} of {total_steps} (metrics of steps 0-"
                      f"{start - 1} restored to {metrics_path.name}); {what}. Delete {ckpt.name} to train from step 0.",
                      file=sys.stderr, flush=True)
            return start, bad, list(history)
    if metrics_path.exists() and is_main:
        metrics_path.unlink()
    return 0, 0, []


def _reference_context(model, ref_model):
    """Context in which `model` (or ref_model) computes the KL reference's log-probs."""
    if ref_model is not None:
        return contextlib.nullcontext(ref_model)
    return _disabled_adapter(model)


@contextlib.contextmanager
def _disabled_adapter(model):
    with model.disable_adapter():
        yield model


@dataclass
class UpdateBatch:
    """This rank's rows of one rollout batch, and where they sit in the step's global batch.

    Attributes:
        input_ids: [n, P + L] prompts and completions of this rank's rows.
        attention_mask: [n, P + L].
        prompt_len: P.
        mask: [n, L] float, 1 on the completion tokens that count (after dynamic sampling / overlong filtering).
        advantages: [n].
        old_logp: [n, L] rollout-policy log-probs (off-policy steps), or None (on-policy: the detached policy's).
        ref_logp: [n, L] KL-reference log-probs, or None.
        row_offset: global index of this rank's first row (rows of a rank are contiguous: whole groups).
        global_rows: N, the number of rows of the global batch.
        sample_logp: [n, L] the sampler's log-probs of the tokens (RolloutBatch.sample_logp), or None: with it the
            update measures the rollout-train mismatch (qerl.rl.mismatch) and, when s.tis_cap > 0, weights each
            token's loss by min(pi_old / pi_sampler, tis_cap).
        valid: [n, L] 1 on every sampled completion token (the mismatch is measured on all of them, also those the
            loss mask drops); defaults to `mask`.
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    prompt_len: int
    mask: torch.Tensor
    advantages: torch.Tensor
    old_logp: torch.Tensor | None
    ref_logp: torch.Tensor | None
    row_offset: int = 0
    global_rows: int | None = None
    sample_logp: torch.Tensor | None = None
    valid: torch.Tensor | None = None


def policy_update(model, opt, sched, trainable: list, s: RunSettings, b: UpdateBatch, step: int,
                  ctx: DistContext = DistContext()) -> dict:
    """`updates_per_rollout` optimizer steps over disjoint minibatches of the step's global batch.

    The minibatches are chunks of a permutation of the GLOBAL rows seeded by (seed, step); each rank runs the rows
    of a minibatch it holds. The loss is normalised over the global minibatch (DAPO: its valid tokens; GRPO: its
    completions with a valid token), so summing the ranks' gradients gives exactly the gradient one process computes
    on the whole batch (up to the order of float additions). A minibatch with no valid token anywhere is skipped on
    every rank; a non-finite global loss skips its update on every rank.

    Args:
        model, opt, sched: the policy, its optimizer and LR scheduler.
        trainable: the trainable parameters (clipped and all-reduced).
        s: the run's settings.
        b: this rank's rows (UpdateBatch).
        step: the training step (seeds the minibatch order).
        ctx: the distributed context (default: one process).

    Returns:
        {"diags": per-update loss diagnostics (global), "grad_norms": [...], "losses": global loss values,
         "skipped": number of updates skipped for a non-finite loss, "ratios": this rank's per-token
         pi_old / pi_sampler over its valid tokens (empty without sample_logp)}.
    """
    loss_fn = grpo_loss if s.algorithm == "grpo" else dapo_loss
    n_global = b.global_rows if b.global_rows is not None else b.input_ids.shape[0]
    lo, hi = b.row_offset, b.row_offset + b.input_ids.shape[0]
    ids, attn, P, mask, adv = b.input_ids, b.attention_mask, b.prompt_len, b.mask, b.advantages
    order = torch.randperm(n_global, generator=torch.Generator().manual_seed(s.seed * 7919 + step))
    diags, grad_norms, losses, skipped, ratios = [], [], [], 0, []
    valid_all = b.valid if b.valid is not None else mask
    model.train()
    for mb in order.chunk(s.updates_per_rollout):
        if ctx.distributed:
            mb = mb[(mb >= lo) & (mb < hi)] - lo  # this rank's rows of the minibatch, in the global order
            local_tokens = float(mask[mb].sum())
            local_seqs = float((mask[mb].sum(1) > 0).sum())
            global_tokens, global_seqs = reduce_sum(ctx, [local_tokens, local_seqs])
            if global_tokens == 0:
                continue
            run_local = local_tokens > 0
        else:
            if mask[mb].sum() == 0:
                continue
            run_local = True
        loss, diag = None, {}
        if run_local:
            logp, _ = sequence_logprobs(model, ids[mb], attn[mb], P)
            old = b.old_logp[mb] if b.old_logp is not None else logp.detach()  # the policy before this update
            ref = None if b.ref_logp is None else b.ref_logp[mb]
            weights = None
            if b.sample_logp is not None:
                valid = valid_all[mb]
                ratios.append(importance_ratios(old, b.sample_logp[mb], valid)[valid.bool()].cpu())
                if s.tis_cap > 0:
                    weights = tis_weights(old, b.sample_logp[mb], valid, s.tis_cap)  # [m, L]
            if s.algorithm == "grpo":
                loss, diag = loss_fn(logp, old, adv[mb], mask[mb], ref, beta=s.kl_coef, eps=s.clip_eps_low,
                                     token_weights=weights)
            else:
                loss, diag = loss_fn(logp, old, adv[mb], mask[mb], eps_low=s.clip_eps_low, eps_high=s.clip_eps_high,
                                     ref_logp=ref, token_weights=weights)
        if ctx.distributed:  # the local share of the global loss, and the global diagnostics (token-weighted)
            if loss is not None:
                loss = loss * (local_tokens / global_tokens if s.algorithm == "dapo" else local_seqs / global_seqs)
            keys = ["clip_fraction"] + (["kl"] if b.ref_logp is not None else [])
            sums = reduce_sum(ctx, [float(loss.detach()) if loss is not None else 0.0]
                              + [diag[k] * local_tokens if run_local else 0.0 for k in keys])
            total, diag = sums[0], {k: v / global_tokens for k, v in zip(keys, sums[1:])}
        else:
            total = float(loss.detach())
        if not math.isfinite(total):
            skipped += 1
            opt.zero_grad(set_to_none=True)
            continue
        if loss is not None:
            loss.backward()
        all_reduce_grads(ctx, trainable)
        grad_norms.append(float(torch.nn.utils.clip_grad_norm_(trainable, s.grad_clip)))
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        diags.append(diag)
        losses.append(total)
    return {"diags": diags, "grad_norms": grad_norms, "losses": losses, "skipped": skipped,
            "ratios": torch.cat(ratios) if ratios else torch.zeros(0)}


def _rollout_seed(seed: int, step: int, rank: int) -> int:
    """Seed of a rank's sampling generator at a step; rank 0 draws what a single process draws."""
    return seed * 1_000_003 + step + rank * 1_000_000_007


def train(cfg: dict, s: RunSettings, base_dir: str | Path, out_dir: str | Path, *, quantized_dir=None,
          data_dir=None, stop_after: int | None = None, evaluate=None, progress: bool = True,
          dist_ctx: DistContext | None = None, device: str | torch.device | None = None) -> dict:
    """Train one run into `out_dir` (resuming from its checkpoint if there is one).

    Under torchrun / accelerate launch (or with `dist_ctx`) each rank rolls out a contiguous slice of the step's
    prompts (whole groups), gradients are summed over ranks with the global loss normalisation (policy_update),
    metrics are reduced over ranks, and rank 0 alone writes files and evaluates.

    Args:
        cfg: validated config.
        s: the run's settings (resolve_settings).
        base_dir: the base model checkpoint folder.
        out_dir: the run folder (metrics.jsonl, checkpoint.pt, adapter/ or model/, run.json).
        quantized_dir: a quantized checkpoint to load for NVFP4/MXFP4 methods (else round-to-nearest on load).
        data_dir: folder of the tiny scale's generated data (default results/<scale>/data/tiny).
        stop_after: stop (as if killed) after this many steps, leaving the checkpoint; for resume tests.
        evaluate: optional callable(model, tokenizer) -> dict, run after training (rank 0); its result is returned.
        progress: show a progress bar with the live reward (rank 0).
        dist_ctx: the distributed context (default: qerl.rl.distributed.init_distributed(), from the environment).
        device: where a single process trains (None: where the model was loaded, the CPU); ranks use their own.

    Returns:
        {"steps": ..., "final": last metrics, "eval": evaluate's result or None}.

    Raises:
        RuntimeError: `max_bad_steps` consecutive non-finite losses.
        ValueError: fewer prompts per step than ranks.
    """
    ctx = init_distributed() if dist_ctx is None else dist_ctx
    if ctx.distributed:
        shard_range(s.prompts_per_step, ctx.rank, ctx.world_size)  # fail before loading anything
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(s.seed)
    problems = load_task_problems(cfg, s, data_dir)
    model, tokenizer = build_policy(cfg, s, base_dir, quantized_dir)
    if ctx.device is not None or device is not None:
        model.to(ctx.device if ctx.device is not None else device)
    device = next(model.parameters()).device
    trainable = [p for p in model.parameters() if p.requires_grad]
    broadcast_params(ctx, trainable)  # every rank starts from rank 0's weights
    opt = _optimizer(trainable, s)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, _lr_lambda(s))
    ref_model = None
    if s.kl_coef > 0 and get_method(s.method).trainable == "all":
        ref_model = copy.deepcopy(model).eval().requires_grad_(False)  # full fine-tuning has no adapter to disable
    aqn = None
    if s.aqn:
        aqn = AdaptiveQuantizationNoise(NoiseSchedule(s.steps, s.aqn_stages, s.sigma_start, s.sigma_end, s.aqn_schedule),
                                        seed=s.seed, resample=s.aqn_resample)
    ckpt, metrics_path = out / "checkpoint.pt", out / "metrics.jsonl"
    identity = run_identity(s, problems, base_dir, quantized_dir)
    start, bad, history = _resume(ckpt, metrics_path, model, opt, sched, identity, s.steps, ctx.is_main)
    if ctx.is_main:
        info = {"settings": s.__dict__, "provenance": provenance()}
        if ctx.distributed:
            info["distributed"] = {"world_size": ctx.world_size, "backend": ctx.backend}
        write_json(out / "run.json", info, default=list)
    G, last = s.group_size, {}
    levels = [p.level for p in problems]
    bar = Readout(s.steps, start, f"{s.task}/{s.method}/{s.variant}/seed{s.seed}", enabled=progress and ctx.is_main)
    for step in range(start, s.steps):
        if stop_after is not None and step >= stop_after:
            break
        indices = _batch_indices(levels, s.seed, step, s.prompts_per_step)
        lo, hi = shard_range(len(indices), ctx.rank, ctx.world_size) if ctx.distributed else (0, len(indices))
        batch_problems = [problems[i] for i in indices[lo:hi]]  # this rank's prompts: whole groups
        prompts = [build_prompt(p.question, tokenizer, s.instruction) for p in batch_problems]
        golds = [p.answer for p in batch_problems for _ in range(G)]
        gen = torch.Generator(device=device).manual_seed(_rollout_seed(s.seed, step, ctx.rank))
        t0 = time.perf_counter()
        noise = aqn.applied(model, step, device) if aqn else contextlib.nullcontext(0.0)
        with noise as sigma:
            batch = sample(model, tokenizer, prompts, group_size=G, max_new_tokens=s.max_new_tokens,
                           temperature=s.temperature, top_p=s.top_p, generator=gen, max_rows=s.rollout_max_rows)
        t_rollout = time.perf_counter() - t0
        results = compute_rewards(batch.texts, golds, format_weight=s.format_weight)
        rewards = torch.tensor([r.reward for r in results], dtype=torch.float32)  # [n]
        correct = torch.tensor([float(r.correct) for r in results])  # [n]
        adv = group_advantages(rewards, G).to(device)  # [n] groups are whole on each rank
        mixed = float((rewards.view(-1, G).amax(1) != rewards.view(-1, G).amin(1)).float().mean())  # groups with signal
        ids, attn, P = batch.input_ids, batch.attention_mask, batch.prompt_len
        mask = batch.completion_mask[:, P:].float()  # [n, L]
        if s.dynamic_sampling:
            mask = mask * dynamic_sampling_mask(rewards, G).to(device).float().unsqueeze(1)
        if s.overlong_filter:
            mask = overlong_filter(mask, batch.truncated.to(device))
        t0 = time.perf_counter()
        with torch.no_grad():
            old_logp = sequence_logprobs(model, ids, attn, P)[0] if s.updates_per_rollout > 1 else None
            ref_logp = None
            if s.kl_coef > 0:
                with _reference_context(model, ref_model) as ref:
                    ref_logp = sequence_logprobs(ref, ids, attn, P)[0]
        t_logprobs = time.perf_counter() - t0
        t0 = time.perf_counter()
        upd = policy_update(model, opt, sched, trainable, s,
                            UpdateBatch(ids, attn, P, mask, adv, old_logp, ref_logp, lo * G, len(indices) * G,
                                        batch.sample_logp.to(device), batch.completion_mask[:, P:].to(device)),
                            step, ctx)
        diags, grad_norms, skipped = upd["diags"], upd["grad_norms"], upd["skipped"]
        bad = bad + 1 if skipped else 0
        if bad >= s.max_bad_steps:
            raise RuntimeError(f"{bad} consecutive steps had a NaN/Inf loss (last at step {step}); lower train.lr "
                               f"(now {s.lr}) or check the model; the last good checkpoint is {ckpt}")
        t_update = time.perf_counter() - t0
        comp = batch.completion_mask[:, P:].cpu()
        last = {
            "step": step, "reward": float(rewards.mean()), "accuracy": float(correct.mean()),
            "entropy": _masked_mean(batch.entropy, comp), "sigma": float(sigma),
            "response_length": float(batch.lengths.float().mean()),
            "loss": _mean(upd["losses"]), "clip_fraction": _mean([d["clip_fraction"] for d in diags]),
            "kl": _mean([d.get("kl", 0.0) for d in diags]),
            "grad_norm": _mean(grad_norms), "grad_clipped": _mean([float(g > s.grad_clip) for g in grad_norms]),
            "mixed_groups": mixed, "adv_abs": float(adv.abs().mean()), "time_rollout": t_rollout,
            "time_logprobs": t_logprobs, "time_update": t_update, "peak_memory_bytes": _peak_memory(), "lr": sched.get_last_lr()[0],
            "skipped_updates": skipped, "kept_fraction": float((mask.sum(1) > 0).float().mean()),
            "truncated_fraction": float(batch.truncated.float().mean()),
            "rollout_tokens": int(batch.lengths.sum()), "rollout_tokens_per_s": float(batch.lengths.sum()) / t_rollout,
            **_mismatch(upd["ratios"], ctx),
        }
        if ctx.distributed:
            last.update(_global_metrics(ctx, rewards, correct, batch.entropy, comp, batch.lengths, mask,
                                        batch.truncated, t_rollout, t_logprobs, t_update, adv, G))
        history.append(json.dumps(last))
        if ctx.is_main:
            with open(metrics_path, "a") as f:
                f.write(history[-1] + "\n")
        bar.step(reward=last["reward"], entropy=last["entropy"], length=last["response_length"],
                 mixed=last["mixed_groups"], **({"sigma": last["sigma"]} if s.aqn else {}))
        if ((step + 1) % s.checkpoint_every == 0 or step + 1 == s.steps) and ctx.is_main:
            _save_checkpoint(ckpt, model, opt, sched, step + 1, bad, history, identity)
    bar.close()
    finished = stop_after is None or stop_after >= s.steps
    if stop_after is not None and not finished:
        if ctx.is_main:
            _save_checkpoint(ckpt, model, opt, sched, len(history), bad, history, identity)
        barrier(ctx)
        return {"steps": min(stop_after, s.steps), "final": last, "eval": None}
    if ctx.is_main:
        weights_dir = out / ("model" if get_method(s.method).trainable == "all" else "adapter")
        shutil.rmtree(weights_dir, ignore_errors=True)
        if get_method(s.method).trainable == "all" and get_method(s.method).weights == "bf16":
            model.save_pretrained(weights_dir)
            tokenizer.save_pretrained(weights_dir)
        elif get_method(s.method).trainable != "all":
            model.save_pretrained(weights_dir)
    barrier(ctx)
    result = evaluate(model, tokenizer) if evaluate is not None and ctx.is_main else None
    return {"steps": s.steps, "final": last, "eval": result, "model": model, "tokenizer": tokenizer}


def _global_metrics(ctx: DistContext, rewards, correct, entropy, comp, lengths, mask, truncated, t_rollout,
                    t_logprobs, t_update, adv, group_size) -> dict:
    """The step's metrics over the global batch: means over every rank's rows, the slowest rank's times, the
    largest peak memory, and the global rollout throughput (all tokens / the slowest rollout)."""
    comp = comp.to(entropy.dtype)
    grouped = rewards.view(-1, group_size)  # [groups, G]
    (r_sum, c_sum, n, e_sum, e_cnt, len_sum, kept, trunc, mixed, a_sum) = reduce_sum(ctx, [
        float(rewards.sum()), float(correct.sum()), float(rewards.numel()), float((entropy * comp).sum()),
        float(comp.sum()), float(lengths.sum()), float((mask.sum(1) > 0).sum()), float(truncated.sum()),
        float((grouped.amax(1) != grouped.amin(1)).sum()), float(adv.abs().sum())])
    t_roll, t_lp, t_up, peak = reduce_max(ctx, [t_rollout, t_logprobs, t_update, float(_peak_memory())])
    return {"reward": r_sum / n, "accuracy": c_sum / n, "entropy": e_sum / max(e_cnt, 1.0),
            "response_length": len_sum / n, "time_rollout": t_roll, "time_logprobs": t_lp, "time_update": t_up,
            "peak_memory_bytes": int(peak), "kept_fraction": kept / n, "truncated_fraction": trunc / n,
            "rollout_tokens": int(len_sum), "rollout_tokens_per_s": len_sum / t_roll,
            "mixed_groups": mixed * group_size / n, "adv_abs": a_sum / n}


def _mismatch(ratios: torch.Tensor, ctx: DistContext) -> dict[str, float]:
    """The step's rollout-train mismatch (qerl/rl/mismatch.py) over every rank's valid tokens."""
    r = all_gather_cat(ctx, ratios).double()  # [T] pi_old / pi_sampler per token
    if r.numel() == 0:
        return {k: float("nan") for k in MISMATCH_KEYS}
    return {"mismatch_kl": float((r - 1.0 - torch.log(r)).mean()), "is_ratio_mean": float(r.mean()),
            "is_ratio_max": float(r.max()), "is_ratio_p99": float(torch.quantile(r, 0.99))}


def _mean(xs: list[float]) -> float:
    xs = [x for x in xs if x is not None and not math.isnan(x)]
    return sum(xs) / len(xs) if xs else 0.0


def add_arguments(parser) -> None:
    parser.add_argument("--config", required=True, help="YAML config")
    parser.add_argument("--task", required=True, help="a key of train.tasks")
    parser.add_argument("--method", required=True, help="full, lora, qlora, mxfp4_lora, nvfp4_lora or qerl")
    parser.add_argument("--variant", default="default", help=VARIANT_FORMS)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--base", required=True, help="base model folder")
    parser.add_argument("--quantized", default=None, help="quantized checkpoint folder (NVFP4/MXFP4 methods)")
    parser.add_argument("--data", default=None, help="tiny scale data folder (default results/<scale>/data/tiny)")
    parser.add_argument("--out", required=True, help="run folder")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("--device", default="auto",
                        help="auto (a CUDA GPU when there is one, else the CPU), cpu, cuda or cuda:N; under torchrun "
                             "each rank uses its local GPU")


def eval_benchmarks(cfg: dict, task: str) -> list[str]:
    """What a run of `task` is evaluated on: train.tasks.<task>.eval_benchmarks, else the task's held-out split(s)."""
    from qerl.data.benchmarks import HELD_OUT

    t = cfg["train"]["tasks"][task]
    return list(t.get("eval_benchmarks") or HELD_OUT[t["source"]])


def run(args) -> int:
    from qerl.config import load_config
    from qerl.evaluate.run import evaluate_model, write_results

    cfg = load_config(args.config)
    torch.set_num_threads(cfg["train"]["threads"])
    s = resolve_settings(cfg, args.task, args.method, args.variant, args.seed)
    tiny_test = Path(args.data) / "test.jsonl" if args.data else None

    def evaluate(model, tokenizer):  # in the training job: no second process start, no reload of the weights
        # The adapter-active probe guards against evaluating the base model by mistake; an adapter whose lora_B is
        # still zero was never updated (every group had equal rewards), which the probe would wrongly call inactive.
        lora_b = [p for n, p in model.named_parameters() if "lora_B" in n]
        updated = any(bool(p.detach().abs().sum() > 0) for p in lora_b)
        return evaluate_model(model, tokenizer, eval_benchmarks(cfg, s.task), cfg, s.seed, tiny_test=tiny_test,
                              require_adapter=updated if lora_b else False,
                              model_info={"method": s.method, "variant": s.variant, "task": s.task,
                                          "base": str(args.base), "quantized": args.quantized,
                                          "adapter_updated": updated if lora_b else None})

    ctx = init_distributed()  # torchrun / accelerate launch: one process per GPU; otherwise a no-op
    device = args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    try:
        result = train(cfg, s, args.base, args.out, quantized_dir=args.quantized, data_dir=args.data,
                       progress=not args.no_progress, evaluate=evaluate, dist_ctx=ctx, device=device)
        if not ctx.is_main:  # rank 0 evaluates and writes eval.json; the other ranks are done
            return 0
        evaluation = result["eval"]
        evaluation["provenance"] = provenance(args.config)
        evaluation["train"] = {"steps": result["steps"], "final": result["final"], "settings": s.__dict__}
        if ctx.distributed:
            evaluation["train"]["world_size"] = ctx.world_size
        write_results(evaluation, Path(args.out) / "eval.json")  # the rule's last output: written last, atomically
        summary = {n: round(b["pass_at_1"], 2) for n, b in evaluation["benchmarks"].items()}
        print(json.dumps({"steps": result["steps"], "final_reward": result["final"].get("reward"), "pass@1": summary}))
        return 0
    finally:
        shutdown(ctx)
