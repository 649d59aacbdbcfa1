"""A training run's settings, resolved once from the config, the task, the method and the variant, and what they
imply for the policy and the optimizer.

Why one module: the trainer, `qerl profile` and the data-parallel benchmark (qerl/profiling/ddp.py) must run the same
step with the same optimizer, learning-rate schedule, LoRA scale and AQN; they all take them from a `RunSettings`
through the functions here (`resolve_settings`, `lora_spec`, `aqn_spec`, `build_run_policy`, `make_optimizer`,
`lr_schedule`), never from their own copies.

    s = resolve_settings(cfg, "tiny_grpo", "qerl", "rank8", seed=0)
    policy = build_run_policy(s, "results/tiny/models/tiny/base", dtype=cfg["model"]["dtype"])

Run the tests: `pytest tests/rl/test_trainer.py -q`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from qerl.contract.methods import get_method, method_lr
from qerl.contract.variants import parse_variant
from qerl.policy import AqnSpec, LoraSpec, Policy, build_policy
from qerl.policy.formats import torch_dtype

__all__ = ["RunSettings", "resolve_settings", "lora_spec", "aqn_spec", "build_run_policy", "check_optimizer",
           "make_optimizer", "lr_schedule"]


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
    update_max_rows: int | None
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
    reward: str
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

    Args:
        cfg: a validated config (qerl.config.load_config).
        task: a key of train.tasks.
        method: a trained method of qerl.contract.methods.
        variant: a variant name (qerl.contract.variants).
        seed: the run's seed.

    Returns:
        The run's settings.

    Raises:
        ValueError: unknown task (naming the configured ones), method or variant; a method with nothing to train;
            `norms` on a method that already trains every weight.
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
        rollout_max_rows=tr["rollout_max_rows"], update_max_rows=tr["update_max_rows"],
        lr=method_lr(cfg, method), warmup_steps=tr["warmup_steps"], min_lr_ratio=tr["min_lr_ratio"],
        weight_decay=tr["weight_decay"], grad_clip=tr["grad_clip"], optimizer=tr["optimizer"],
        temperature=tr["temperature"], top_p=tr["top_p"], clip_eps_low=tr["clip_eps_low"],
        clip_eps_high=tr["clip_eps_high"], kl_coef=tr["kl_coef"], format_weight=tr["format_weight"],
        reward=t.get("reward", "answer"),
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


def lora_spec(s: RunSettings) -> LoraSpec | None:
    """The run's new LoRA adapters (None for a method that trains every weight)."""
    if get_method(s.method).trainable != "lora":
        return None
    return LoraSpec(rank=s.lora_rank, alpha=s.lora_alpha, dropout=s.lora_dropout, targets=tuple(s.lora_targets),
                    train_norms=s.train_norms)


def aqn_spec(s: RunSettings) -> AqnSpec | None:
    """The run's AQN (schedule over s.steps, seeded by s.seed), or None when AQN is off."""
    if not s.aqn:
        return None
    from qerl.noise import NoiseSchedule

    return AqnSpec(NoiseSchedule(s.steps, s.aqn_stages, s.sigma_start, s.sigma_end, s.aqn_schedule), seed=s.seed,
                   resample=s.aqn_resample)


def build_run_policy(s: RunSettings, base, *, quantized: str | Path | None = None, tokenizer=None,
                     device: str | torch.device | None = None, dtype: str | torch.dtype = "float32",
                     nf4_decode: str = "bitsandbytes") -> Policy:
    """`build_policy` for a run: the method's format, the run's LoRA adapters (or every weight), AQN and gradient
    checkpointing as the settings say.

    Args:
        s: the run's settings.
        base: the base checkpoint folder or a model (qerl.policy.build_policy).
        quantized: the quantization stage's checkpoint of the method's format.
        tokenizer: the tokenizer of a model given as `base`.
        device: where the policy trains.
        dtype: config model.dtype.
        nf4_decode: config model.nf4_decode (qerl.policy.build_policy).

    Returns:
        The Policy.

    Raises:
        ValueError, RuntimeError: as qerl.policy.build_policy.
    """
    sample_dtype = None
    if get_method(s.method).trainable == "all" and torch_dtype(dtype) in (torch.bfloat16, torch.float16):
        # full fine-tuning keeps float32 master weights: AdamW steps on 16-bit weights round small updates away
        # and diverged on SmolLM2 in bfloat16 (NaN loss at step 3 on an H100); LoRA methods train float32 adapters.
        # It samples (rollouts, evaluation) in the config's dtype, like every other method (Policy.sampling_model)
        sample_dtype, dtype = torch_dtype(dtype), "float32"
    policy = build_policy(s.method, base, quantized=quantized, lora=lora_spec(s), aqn=aqn_spec(s),
                          tokenizer=tokenizer, device=device, dtype=dtype,
                          gradient_checkpointing=s.gradient_checkpointing, nf4_decode=nf4_decode)
    policy.sample_dtype = sample_dtype
    return policy


def _no_adamw8bit(exc: Exception) -> RuntimeError:
    return RuntimeError(f"train.optimizer = adamw8bit, but bitsandbytes' AdamW8bit is unavailable here ({exc}); set "
                        "train.optimizer: adamw")


def _adamw8bit():
    """bitsandbytes' AdamW8bit class, or RuntimeError naming the fix."""
    try:
        import bitsandbytes as bnb

        return bnb.optim.AdamW8bit
    except Exception as exc:  # noqa: BLE001 - report whatever bitsandbytes raised
        raise _no_adamw8bit(exc) from exc


def check_optimizer(s: RunSettings) -> None:
    """Fail now, naming the fix, where `make_optimizer` would fail later (adamw8bit without bitsandbytes): for a job
    that builds its optimizer only after minutes of other work (qerl profile's GRPO step, after its rollouts).

    Raises:
        RuntimeError: adamw8bit where bitsandbytes' AdamW8bit is unavailable.
    """
    if s.optimizer == "adamw8bit":
        _adamw8bit()


def make_optimizer(params: list, s: RunSettings) -> torch.optim.Optimizer:
    """The run's optimizer over `params`: AdamW (betas 0.9 / 0.99), or bitsandbytes' 8-bit AdamW (the paper's).

    Raises:
        RuntimeError: adamw8bit where bitsandbytes' AdamW8bit is unavailable.
    """
    if s.optimizer == "adamw8bit":
        cls = _adamw8bit()
        try:
            return cls(params, lr=s.lr, weight_decay=s.weight_decay)
        except Exception as exc:  # noqa: BLE001 - report whatever bitsandbytes raised
            raise _no_adamw8bit(exc) from exc
    return torch.optim.AdamW(params, lr=s.lr, weight_decay=s.weight_decay, betas=(0.9, 0.99))


def lr_schedule(s: RunSettings):
    """The LR multiplier per optimizer update (torch LambdaLR): linear warmup over warmup_steps x updates_per_rollout
    updates, then a cosine decay to min_lr_ratio at the last update of the run."""
    total = s.steps * s.updates_per_rollout
    warm = s.warmup_steps * s.updates_per_rollout

    def f(i: int) -> float:
        if i < warm:
            return (i + 1) / warm
        u = min(1.0, (i - warm) / max(1, total - warm))
        return s.min_lr_ratio + (1 - s.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * u))

    return f
