"""One GRPO / DAPO step -- rollout, rewards, advantages, log-probs, update -- as the trainer runs it, and as
`qerl profile` (Tables 3, 5-8) and the data-parallel benchmark (qerl/profiling/ddp.py) time it.

Why one public step: the efficiency tables must time the step training runs, not a re-assembled copy with its own
optimizer and LoRA scale. `rl_step(learner, batch, settings)` is that step; `make_learner(policy, settings)` gives
it the run's optimizer and schedule (qerl/rl/settings.py), so the three callers differ only in where the prompts
and rewards come from.

A step (settings s, this rank's prompts):
  1. sample s.group_size completions per prompt from the policy, under the step's AQN noise (Policy.rollout_noise:
     RMSNorm weights perturbed during the rollout only, restored bit-exactly before any log-prob);
  2. grade them (qerl.rl.rewards, or the caller's reward function) and normalise rewards within each group; DAPO may
     drop groups whose rewards are all equal (dynamic sampling) and mask truncated completions (overlong filter);
  3. with several updates per rollout, compute the clean pre-update policy's log-probs ("old") of the rows after the
     first minibatch (that minibatch's own pass, at the same weights, gives its rows'); with a KL term the
     reference's (the same model with its adapters disabled, or a frozen copy for full fine-tuning);
  4. `policy_update`: `updates_per_rollout` optimizer steps over disjoint minibatches of the GLOBAL batch, the loss
     normalised over the global minibatch, gradients summed over ranks;
  5. return the step's `MetricsRow` (qerl.contract.records), reduced over ranks; on CUDA the phase times are taken
     between device synchronisations.
Deviations from the paper (which trains with verl + vLLM): rollouts use our sampler on the training model; the
minibatch split of an off-policy step is over rows in a seeded order; GRPO clips the ratio with clip_eps_low on both
sides, DAPO with clip_eps_low / clip_eps_high.

Run the tests: `pytest tests/rl/test_trainer.py tests/rl/test_distributed.py tests/profiling -q`.
"""
from __future__ import annotations

import contextlib
import copy
import math
import time
from dataclasses import dataclass

import torch

from qerl.contract.records import MetricsRow
from qerl.memory import peak_memory_bytes
from qerl.policy import Policy
from qerl.rl.distributed import (DistContext, all_gather_cat, all_reduce_grads, broadcast_params, reduce_max,
                                 reduce_sum)
from qerl.rl.losses import dapo_loss, dynamic_sampling_mask, grpo_loss, group_advantages, overlong_filter
from qerl.rl.mismatch import importance_ratios, mismatch_stats, tis_weights
from qerl.rl.rewards import coin_rewards, compute_rewards
from qerl.rl.rollout import sample, sequence_logprobs
from qerl.rl.rollout_log import step_samples
from qerl.rl.settings import RunSettings, lr_schedule, make_optimizer

__all__ = ["Learner", "make_learner", "StepBatch", "UpdateBatch", "minibatches", "policy_update", "rollout_seed",
           "rl_step"]


@dataclass
class Learner:
    """A policy with what updates it: the run's optimizer and LR schedule over its trainable parameters, and the
    frozen KL reference where adapters cannot stand in for it (full fine-tuning with kl_coef > 0)."""

    policy: Policy
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LambdaLR
    trainable: list
    ref_model: torch.nn.Module | None = None

    @property
    def model(self) -> torch.nn.Module:
        return self.policy.model

    @property
    def tokenizer(self):
        return self.policy.tokenizer


def make_learner(policy: Policy, s: RunSettings, ctx: DistContext = DistContext()) -> Learner:
    """The run's optimizer (make_optimizer) and schedule (lr_schedule) over the policy's trainable parameters, which
    every rank first takes from rank 0.

    Raises:
        RuntimeError: adamw8bit without bitsandbytes.
    """
    trainable = policy.trainable_parameters()
    broadcast_params(ctx, trainable)  # every rank starts from rank 0's weights
    opt = make_optimizer(trainable, s)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_schedule(s))
    ref_model = None
    if s.kl_coef > 0 and policy.method.trainable == "all":
        ref_model = copy.deepcopy(policy.model).eval().requires_grad_(False)  # full fine-tuning: no adapter to disable
    return Learner(policy, opt, sched, trainable, ref_model)


@dataclass
class StepBatch:
    """This rank's prompts of one step.

    Attributes:
        step: the 0-based training step (seeds the sampling, the AQN noise and the minibatch order).
        prompts: the chat-formatted prompts of this rank (whole groups: each is sampled group_size times).
        golds: their reference answers, one per prompt.
        row_offset: global index of this rank's first row (rows = prompts x group_size, ranks contiguous).
        global_rows: rows of the whole step over all ranks (None: this rank's alone).
        prompt_ids: the problems' ids, one per prompt (named in the rollout samples; None: "prompt<k>", k the
            prompt's index in the step's global batch).
    """

    step: int
    prompts: list[str]
    golds: list[str]
    row_offset: int = 0
    global_rows: int | None = None
    prompt_ids: list[str] | None = None


@dataclass
class UpdateBatch:
    """This rank's rows of one rollout batch, and where they sit in the step's global batch.

    Attributes:
        input_ids: [n, P + L] prompts and completions of this rank's rows.
        attention_mask: [n, P + L].
        prompt_len: P.
        mask: [n, L] float, 1 on the completion tokens that count (after dynamic sampling / overlong filtering).
        advantages: [n].
        old_logp: [n, L] log-probs of the policy before the update (off-policy steps), or None (on-policy: the
            detached policy's).
        ref_logp: [n, L] KL-reference log-probs, or None.
        row_offset: global index of this rank's first row (rows of a rank are contiguous: whole groups).
        global_rows: N, the number of rows of the global batch.
        sample_logp: [n, L] the sampler's log-probs of the tokens (RolloutBatch.sample_logp), or None: with it the
            update measures the rollout-train mismatch (qerl.rl.mismatch) and, when s.tis_cap > 0, weights each
            token's loss by min(pi_old / pi_sampler, tis_cap).
        valid: [n, L] 1 on every sampled completion token (the mismatch is measured on all of them, also those the
            loss mask drops); defaults to `mask`.
        old_skips_first: old_logp leaves out the rows of the first minibatch (`minibatches`; rl_step leaves them
            NaN): that minibatch runs before any optimizer step, at the weights old_logp was computed with, so its own
            pass's detached log-probs are its old ones.
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
    old_skips_first: bool = False


def minibatches(s: RunSettings, step: int, n_global: int) -> tuple[torch.Tensor, ...]:
    """The update's minibatches: `updates_per_rollout` chunks of a permutation of the step's global rows, seeded by
    (seed, step)."""
    order = torch.randperm(n_global, generator=torch.Generator().manual_seed(s.seed * 7919 + step))
    return order.chunk(s.updates_per_rollout)


def policy_update(learner: Learner, s: RunSettings, b: UpdateBatch, step: int,
                  ctx: DistContext = DistContext()) -> dict:
    """`updates_per_rollout` optimizer steps over disjoint minibatches of the step's global batch.

    The minibatches are chunks of a permutation of the GLOBAL rows seeded by (seed, step) (`minibatches`); each rank
    runs the rows of a minibatch it holds (with b.old_skips_first, the first takes its old log-probs from its own
    pass). The loss is normalised over the global minibatch (DAPO: its valid tokens; GRPO: its completions with a
    valid token), so summing the ranks' gradients gives exactly the gradient one process computes on the whole batch
    (up to the order of float additions). A minibatch with no valid token anywhere is skipped on every rank; one whose
    counted rows all have advantage 0 (and no KL term) gets zero gradients without a backward and still takes its
    optimizer step; a non-finite global loss, or a non-finite gradient norm (identical on every rank after the
    all-reduce), skips its update on every rank.

    Args:
        learner: the policy, its optimizer, LR scheduler and trainable parameters (clipped and all-reduced).
        s: the run's settings.
        b: this rank's rows (UpdateBatch).
        step: the training step (seeds the minibatch order).
        ctx: the distributed context (default: one process).

    Returns:
        {"diags": per-update loss diagnostics (global), "grad_norms": [...], "losses": global loss values,
         "skipped": number of updates skipped for a non-finite loss or gradient, "ratios": this rank's per-token
         pi_old / pi_sampler over its valid tokens (empty without sample_logp)}.
    """
    model, opt, sched, trainable = learner.model, learner.optimizer, learner.scheduler, learner.trainable
    n_global = b.global_rows if b.global_rows is not None else b.input_ids.shape[0]
    lo, hi = b.row_offset, b.row_offset + b.input_ids.shape[0]
    ids, attn, P, mask, adv = b.input_ids, b.attention_mask, b.prompt_len, b.mask, b.advantages
    diags, grad_norms, losses, skipped, ratios = [], [], [], 0, []
    valid_all = b.valid if b.valid is not None else mask
    model.train()
    for i, mb in enumerate(minibatches(s, step, n_global)):
        if ctx.distributed:
            mb = mb[(mb >= lo) & (mb < hi)] - lo  # this rank's rows of the minibatch, in the global order
            local_tokens = float(mask[mb].sum())
            local_seqs = float((mask[mb].sum(1) > 0).sum())
            global_tokens, global_seqs = reduce_sum(ctx, [local_tokens, local_seqs])
            if global_tokens == 0:
                continue
            run_local = local_tokens > 0
            # this rank's share of the global loss (its normaliser: DAPO valid tokens, GRPO completions)
            rank_share = local_tokens / global_tokens if s.algorithm == "dapo" else local_seqs / global_seqs
        else:
            if mask[mb].sum() == 0:
                continue
            run_local, rank_share = True, 1.0
        # No signal: every advantage of the minibatch's counted rows is 0 and there is no KL term, so the loss is 0
        # and so is its exact gradient. The backward is skipped (on an H100 in bfloat16 the backward of this
        # all-zero loss gave NaN gradients in every LoRA weight whenever a step's rewards were all 0) and the
        # optimizer steps on zero gradients, as it would after that backward on the CPU.
        signal = float(((adv[mb] != 0) & (mask[mb].sum(1) > 0)).any()) if run_local else 0.0
        if ctx.distributed:
            (signal,) = reduce_sum(ctx, [signal])
        zero_signal = signal == 0 and s.kl_coef == 0
        loss, diag, done = None, {}, False
        if run_local:
            parts = mb.split(s.update_max_rows) if s.update_max_rows and len(mb) > s.update_max_rows else (mb,)
            if len(parts) == 1:
                loss, diag = _minibatch_loss(model, s, b, mb, i, zero_signal, valid_all, ratios)
            else:  # gradient accumulation over row parts, each weighted by its share of the minibatch's loss
                loss, diag = _accumulate(model, s, b, mb, parts, i, zero_signal, valid_all, ratios, rank_share)
                done = True  # each part's backward has run (a non-finite total below still drops the gradients)
        if ctx.distributed:  # the local share of the global loss, and the global diagnostics (token-weighted)
            if loss is not None:
                loss = loss * rank_share
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
        if zero_signal:
            for p in trainable:
                p.grad = torch.zeros_like(p)
        elif loss is not None and not done:
            loss.backward()
        all_reduce_grads(ctx, trainable)
        norm = float(torch.nn.utils.clip_grad_norm_(trainable, s.grad_clip))
        if not math.isfinite(norm):  # an inf/NaN gradient would turn every weight into NaN through the clip
            skipped += 1
            opt.zero_grad(set_to_none=True)
            continue
        grad_norms.append(norm)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        diags.append(diag)
        losses.append(total)
    return {"diags": diags, "grad_norms": grad_norms, "losses": losses, "skipped": skipped,
            "ratios": torch.cat(ratios) if ratios else torch.zeros(0)}


def _minibatch_loss(model, s: RunSettings, b: UpdateBatch, rows: torch.Tensor, i: int, zero_signal: bool,
                    valid_all: torch.Tensor, ratios: list) -> tuple[torch.Tensor, dict]:
    """The policy loss of `rows` (local row indices of minibatch `i`) and its diagnostics; appends the rows'
    importance ratios (pi_old / pi_sampler) to `ratios` where the sampler's log-probs are known."""
    with torch.set_grad_enabled(not zero_signal):
        logp, _ = sequence_logprobs(model, b.input_ids[rows], b.attention_mask[rows], b.prompt_len)
    own = b.old_logp is None or (i == 0 and b.old_skips_first)  # the policy before this update
    old = logp.detach() if own else b.old_logp[rows]
    ref = None if b.ref_logp is None else b.ref_logp[rows]
    mask, adv = b.mask[rows], b.advantages[rows]
    weights = None
    if b.sample_logp is not None:
        valid = valid_all[rows]
        ratios.append(importance_ratios(old, b.sample_logp[rows], valid)[valid.bool()].cpu())
        if s.tis_cap > 0:
            weights = tis_weights(old, b.sample_logp[rows], valid, s.tis_cap)  # [m, L]
    if s.algorithm == "grpo":
        return grpo_loss(logp, old, adv, mask, ref, beta=s.kl_coef, eps=s.clip_eps_low, token_weights=weights)
    return dapo_loss(logp, old, adv, mask, eps_low=s.clip_eps_low, eps_high=s.clip_eps_high, ref_logp=ref,
                     token_weights=weights)


def _normaliser(mask: torch.Tensor, algorithm: str) -> float:
    """What the policy loss of rows with this mask [m, L] is normalised by: DAPO their valid tokens, GRPO their
    completions with a valid token."""
    return float(mask.sum()) if algorithm == "dapo" else float((mask.sum(1) > 0).sum())


def _accumulate(model, s: RunSettings, b: UpdateBatch, mb: torch.Tensor, parts: tuple[torch.Tensor, ...], i: int,
                zero_signal: bool, valid_all: torch.Tensor, ratios: list,
                rank_share: float = 1.0) -> tuple[torch.Tensor, dict]:
    """Minibatch `i`'s loss over row parts of at most train.update_max_rows rows, each part's backward run at once
    (its activations freed before the next part), so the peak memory is one part's. Each part's loss is weighted by
    its share of the minibatch's normaliser (DAPO: valid tokens; GRPO: completions with a valid token), the weighting
    the ranks of a distributed update use: the summed gradients are the one-pass gradient up to the order of float
    additions. `rank_share`: this rank's share of the global minibatch's loss (1 in one process), applied to the
    backward only (the caller scales the returned loss as for an unsplit minibatch). Returns the summed (detached)
    loss of the rank's rows and the diagnostics: token-weighted means, ratio_min / ratio_max the extremes."""
    whole = _normaliser(b.mask[mb], s.algorithm)
    total, sums, weight_sum, diag = 0.0, {}, 0.0, {}
    for part in parts:
        w = _normaliser(b.mask[part], s.algorithm) / whole
        if w == 0:
            continue
        loss, d = _minibatch_loss(model, s, b, part, i, zero_signal, valid_all, ratios)
        if not zero_signal:
            (loss * (w * rank_share)).backward()
        total += float(loss.detach()) * w
        t = float(b.mask[part].sum())
        weight_sum += t
        for k, v in d.items():
            if k == "ratio_min":
                diag[k] = min(diag.get(k, math.inf), v)
            elif k == "ratio_max":
                diag[k] = max(diag.get(k, -math.inf), v)
            else:
                sums[k] = sums.get(k, 0.0) + v * t
    diag.update({k: v / weight_sum for k, v in sums.items()})
    return torch.tensor(total), diag


def rollout_seed(seed: int, step: int, rank: int) -> int:
    """Seed of a rank's sampling generator at a step; rank 0 draws what a single process draws."""
    return seed * 1_000_003 + step + rank * 1_000_000_007


def _phase(name: str):
    """A named range for the torch profiler (qerl.profiling.train_trace splits a step's kernels by it); without an
    active profiler it costs about a microsecond."""
    return torch.profiler.record_function(name)


def _now(device: torch.device) -> float:
    """perf_counter after the device's queued work (CUDA kernels run asynchronously) is done."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


@contextlib.contextmanager
def _reference(learner: Learner):
    """The model whose log-probs are the KL reference: the frozen copy, or the policy with its adapters disabled."""
    if learner.ref_model is not None:
        yield learner.ref_model
    else:
        with learner.model.disable_adapter():
            yield learner.model


def rl_step(learner: Learner, batch: StepBatch, s: RunSettings, ctx: DistContext = DistContext(), *,
            reward_fn=None, samples: list | None = None) -> MetricsRow:
    """Run one training step on this rank's prompts (module docstring) and return its metrics.

    Args:
        learner: the policy and its optimizer (make_learner).
        batch: this rank's prompts and answers, and where its rows sit in the step's global batch.
        s: the run's settings.
        ctx: the distributed context (default: one process).
        reward_fn: (texts, golds, format_weight=...) -> objects with .reward and .correct (default:
            qerl.rl.rewards.compute_rewards); the profilers pass seeded random rewards.
        samples: when a list, this rank's rollout rows are appended to it as RolloutSample records
            (qerl.rl.rollout_log.step_samples), in row order.

    Returns:
        The step's MetricsRow (over every rank's rows when distributed); skipped_updates counts the updates a
        non-finite loss skipped (the caller decides when to give up).
    """
    model, tokenizer, G = learner.model, learner.tokenizer, s.group_size
    device = next(model.parameters()).device
    golds = [g for g in batch.golds for _ in range(G)]
    gen = torch.Generator(device=device).manual_seed(rollout_seed(s.seed, batch.step, ctx.rank))
    t0 = _now(device)
    with _phase("rl_step.rollout"), learner.policy.rollout_noise(batch.step, device) as sigma:
        rb = sample(learner.policy.sampling_model(), tokenizer, batch.prompts, group_size=G, max_new_tokens=s.max_new_tokens,
                    temperature=s.temperature, top_p=s.top_p, generator=gen, max_rows=s.rollout_max_rows,
                    engine=False if learner.policy.eager_rollout else None)
    t_rollout = _now(device) - t0
    if reward_fn is None and s.reward == "coin":  # timing runs on random weights (train.tasks.<t>.reward)
        reward_fn = coin_rewards(s.seed, batch.step, ctx.rank)
    results = (reward_fn or compute_rewards)(rb.texts, golds, format_weight=s.format_weight)
    rewards = torch.tensor([r.reward for r in results], dtype=torch.float32)  # [n]
    correct = torch.tensor([float(r.correct) for r in results])  # [n]
    adv = group_advantages(rewards, G).to(device)  # [n] groups are whole on each rank
    mixed = float((rewards.view(-1, G).amax(1) != rewards.view(-1, G).amin(1)).float().mean())  # groups with signal
    ids, attn, P = rb.input_ids, rb.attention_mask, rb.prompt_len
    sampled = rb.completion_mask[:, P:]  # [n, L] every sampled completion token
    mask = sampled.float()  # [n, L] those the loss counts
    if samples is not None:
        first = batch.row_offset // G
        names = batch.prompt_ids or [f"prompt{first + i}" for i in range(len(batch.prompts))]
        samples += step_samples(batch.step, names, batch.golds, G, rb.texts, results, rb.lengths, rb.truncated,
                                rb.sample_logp, rb.entropy, sampled, float(sigma))
    if s.dynamic_sampling:
        mask = mask * dynamic_sampling_mask(rewards, G).to(device).float().unsqueeze(1)
    if s.overlong_filter:
        mask = overlong_filter(mask, rb.truncated.to(device))
    t0 = _now(device)
    rows = batch.global_rows if batch.global_rows is not None else len(batch.prompts) * G
    with _phase("rl_step.logprobs"), torch.no_grad():
        old_logp = _old_logprobs(model, ids, attn, P, minibatches(s, batch.step, rows), batch.row_offset) \
            if s.updates_per_rollout > 1 else None
        ref_logp = None
        if s.kl_coef > 0:
            with _reference(learner) as ref:
                ref_logp = sequence_logprobs(ref, ids, attn, P)[0]
    t_logprobs = _now(device) - t0
    t0 = _now(device)
    with _phase("rl_step.update"):
        upd = policy_update(learner, s, UpdateBatch(ids, attn, P, mask, adv, old_logp, ref_logp, batch.row_offset, rows,
                                                    rb.sample_logp.to(device), sampled.to(device),
                                                    old_skips_first=old_logp is not None),
                            batch.step, ctx)
    t_update = _now(device) - t0
    diags, grad_norms = upd["diags"], upd["grad_norms"]
    comp = sampled.cpu()
    row = {
        "step": batch.step, "reward": float(rewards.mean()), "accuracy": float(correct.mean()),
        "entropy": _masked_mean(rb.entropy, comp), "sigma": float(sigma),
        "response_length": float(rb.lengths.float().mean()),
        "loss": _mean(upd["losses"]), "clip_fraction": _mean([d["clip_fraction"] for d in diags]),
        "kl": _mean([d.get("kl", 0.0) for d in diags]),
        "grad_norm": _mean(grad_norms), "grad_clipped": _mean([float(g > s.grad_clip) for g in grad_norms]),
        "mixed_groups": mixed, "adv_abs": float(adv.abs().mean()), "time_rollout": t_rollout,
        "time_logprobs": t_logprobs, "time_update": t_update, "peak_memory_bytes": peak_memory_bytes(),
        "lr": learner.scheduler.get_last_lr()[0], "skipped_updates": upd["skipped"],
        "kept_fraction": float((mask.sum(1) > 0).float().mean()),
        "truncated_fraction": float(rb.truncated.float().mean()),
        "rollout_tokens": int(rb.lengths.sum()), "rollout_tokens_per_s": float(rb.lengths.sum()) / t_rollout,
        **mismatch_stats(all_gather_cat(ctx, upd["ratios"])),  # over every rank's valid tokens
    }
    if ctx.distributed:
        row.update(_global_metrics(ctx, rewards, correct, rb.entropy, comp, rb.lengths, mask, rb.truncated,
                                   t_rollout, t_logprobs, t_update, adv, G))
    return MetricsRow(**row)


def _old_logprobs(model, ids: torch.Tensor, attn: torch.Tensor, prompt_len: int, mbs: tuple[torch.Tensor, ...],
                  row_offset: int = 0) -> torch.Tensor:
    """The pre-update policy's log-probs [n, L] of this rank's rows (the global rows row_offset .. row_offset + n) in
    the update's minibatches `mbs` (global row indices), but for the first minibatch's rows, which stay NaN:
    policy_update takes those from that minibatch's own pass at the same weights.

    Why: with U updates per rollout that skips 1/U of the old pass (GRPO at the tiny scale: 32 of 128 rows). On the
    CPU a row's log-probs do not depend on the other rows of a pass, with or without grad (every op is row by row at
    these shapes), so they are the ones one pass over every row gives, bit for bit (tests/rl/test_trainer.py); on
    CUDA equal up to the kernels' choice by batch size. On the CPU the pass runs minibatch by minibatch, at the rows
    of the update's own passes: one 96-row pass touched three times the memory of a 32-row one (page faults, cache)
    and took ~25 % longer than three of them; on CUDA, where passes are launch-bound, one pass over all those rows.
    """
    n = ids.shape[0]
    local = [mb[(mb >= row_offset) & (mb < row_offset + n)] - row_offset for mb in mbs[1:]]
    local = [rows.to(ids.device) for rows in local if len(rows)]
    old = torch.full((n, ids.shape[1] - prompt_len), float("nan"), device=ids.device)  # [n, L]
    for rows in ([torch.cat(local)] if ids.is_cuda and local else local):
        old[rows] = sequence_logprobs(model, ids[rows], attn[rows], prompt_len)[0]
    return old


def _masked_mean(x: torch.Tensor, mask: torch.Tensor) -> float:
    m = mask.to(x.dtype)
    return float((x * m).sum() / m.sum().clamp(min=1))


def _mean(xs: list[float]) -> float:
    xs = [x for x in xs if x is not None and not math.isnan(x)]
    return sum(xs) / len(xs) if xs else 0.0


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
    t_roll, t_lp, t_up, peak = reduce_max(ctx, [t_rollout, t_logprobs, t_update, float(peak_memory_bytes())])
    return {"reward": r_sum / n, "accuracy": c_sum / n, "entropy": e_sum / max(e_cnt, 1.0),
            "response_length": len_sum / n, "time_rollout": t_roll, "time_logprobs": t_lp, "time_update": t_up,
            "peak_memory_bytes": int(peak), "kept_fraction": kept / n, "truncated_fraction": trunc / n,
            "rollout_tokens": int(len_sum), "rollout_tokens_per_s": len_sum / t_roll,
            "mixed_groups": mixed * group_size / n, "adv_abs": a_sum / n}
