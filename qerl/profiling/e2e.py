"""The end-to-end GRPO step of the efficiency tables: the trainer's own step (qerl.rl.step.rl_step), timed on a
random-weight model of a real architecture.

Why: Tables 3 and 5-8 compare the seconds of one GRPO step of each method. That step must be the one training runs
-- rollout through the same sampler and engine, the same log-probs, the same `policy_update` with the run's
optimizer, learning-rate schedule, LoRA scale and AQN -- not a re-assembled copy. So the settings come from a
training config (`profile_settings`: a task's RunSettings, as `qerl train` resolves them, at the profile's shape),
the policy from the policy core (qerl.rl.settings.build_run_policy over qerl.profiling.build.random_base), and the
step is `rl_step`. Only the data is synthetic: random-token prompts (`RandomPromptTokenizer`) and seeded random 0/1
rewards (`RandomRewards`, so every group has a non-zero advantage and every update has a gradient).

Shape of a step at batch B: one prompt of `prompt` random tokens, sampled B times (group_size = B), completions of
up to `completion` tokens (a random model almost never samples its EOS, so they run to the budget); the task's
updates per rollout, optimizer and clip settings. One untimed warm-up step (kernel autotuning, CUDA graph capture,
optimizer state; with gradient checkpointing, which needs the least memory) precedes the timed steps; the timed
step index is half the run's steps, where AQN is in force for the methods that use it.

    s = profile_settings(cfg, "gsm8k", "qerl", rank=32, batch=8, completion=2048)
    policy = build_run_policy(s, random_base("7B", "nvfp4"), tokenizer=RandomPromptTokenizer(152064, 256, 151643))
    timings = e2e_timing(policy, s, gcs=(False, True))   # {False: {...}, True: {...}} or "OOM" per setting

Runs on the CPU too (tests/profiling/test_e2e_cpu.py); `qerl profile` runs it on a GPU.
"""
from __future__ import annotations

import zlib
from dataclasses import dataclass, replace

import torch

from qerl.contract.methods import get_method
from qerl.contract.variants import rank_variant
from qerl.rl.rewards import coin_draws

__all__ = ["RandomPromptTokenizer", "RandomRewards", "default_task", "profile_settings", "e2e_timing"]


class RandomPromptTokenizer:
    """The part of a tokenizer that `qerl.rl.rollout.sample` uses, for prompts of random tokens.

    A prompt text maps to `prompt_len` token ids drawn from a generator seeded by the text, so a prompt is the same
    tokens on every rank and every run; decoding returns empty strings (rewards here do not read the text), and no
    token spells a stop string.
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

    def convert_ids_to_tokens(self, ids) -> list[str]:
        return [""] * len(ids)


@dataclass(frozen=True)
class _Reward:
    reward: float
    correct: bool


class RandomRewards:
    """A reward function for `rl_step` that ignores the texts: seeded 0/1 rewards, a new draw per call.

    Args:
        seed: the stream's seed (e.g. the rank, so ranks draw different rewards).
    """

    def __init__(self, seed: int = 0):
        self.seed, self.calls = seed, 0

    def __call__(self, texts: list[str], golds: list, format_weight: float = 0.0) -> list[_Reward]:
        draws = coin_draws(self.seed * 7919 + self.calls, len(texts))  # [n]
        self.calls += 1
        return [_Reward(float(d), bool(d)) for d in draws]


def default_task(cfg: dict) -> str:
    """The first GRPO task of train.tasks (the paper's efficiency tables time GRPO steps).

    Raises:
        ValueError: when the config has no GRPO task.
    """
    for name, task in cfg["train"]["tasks"].items():
        if task["algorithm"] == "grpo":
            return name
    raise ValueError(f"config key 'train.tasks' has no task with algorithm grpo ({sorted(cfg['train']['tasks'])}); "
                     "name one with --task")


def profile_settings(cfg: dict, task: str, method: str, *, rank: int, batch: int, completion: int,
                     prompts: int = 1):
    """The RunSettings of a `method` run of `task` (qerl.rl.settings.resolve_settings) at the profile's shape.

    Args:
        cfg: a validated config (the run's: its train section and the task give optimizer, schedule, LoRA alpha /
            rank, clip, KL, updates per rollout, AQN).
        task: a key of train.tasks.
        method: a trained method.
        rank: the LoRA rank (alpha scaled with it as the rank<r> variant does, so alpha / r stays the run's).
        batch: samples per prompt (the step's rows when prompts = 1).
        completion: generation budget in tokens.
        prompts: prompts per step (per rank).

    Returns:
        The settings (seed 0).

    Raises:
        ValueError: unknown task or method (as resolve_settings).
    """
    from qerl.rl.settings import resolve_settings

    variant = rank_variant(rank) if get_method(method).trainable == "lora" else "default"
    s = resolve_settings(cfg, task, method, variant, seed=0)
    return replace(s, group_size=batch, prompts_per_step=prompts, max_new_tokens=completion)


def _reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def e2e_timing(policy, s, *, gcs: tuple[bool, ...] = (False, True), reward_seed: int = 0) -> dict:
    """Time `rl_step` on `policy` with settings `s`: one warm-up step, then one timed step per gradient
    checkpointing setting in `gcs`.

    Args:
        policy: the run's policy (qerl.policy.Policy with a RandomPromptTokenizer-like tokenizer).
        s: its settings (profile_settings).
        gcs: gradient checkpointing off / on, each timed once.
        reward_seed: seed of the random rewards.

    Returns:
        {gc: {"step_s", "rollout_s", "logprob_s", "update_s", "peak_bytes", "rollout_tokens"} or "OOM"}: phases in
        seconds (step_s their sum), the peak memory of the timed step, the tokens it sampled.

    Raises:
        torch.OutOfMemoryError: when the warm-up step itself runs out of memory.
    """
    from qerl.policy import set_gradient_checkpointing
    from qerl.rl.step import StepBatch, make_learner, rl_step

    learner = make_learner(policy, s)
    rewards = RandomRewards(reward_seed)
    prompts = [f"profile-b{s.group_size}-p{i}" for i in range(s.prompts_per_step)]
    batch = StepBatch(s.steps // 2, prompts, ["0"] * len(prompts))
    device = policy.device
    try:
        set_gradient_checkpointing(policy.model, True)
        rl_step(learner, batch, s, reward_fn=rewards)  # warm-up
        out: dict = {}
        for gc in gcs:
            set_gradient_checkpointing(policy.model, gc)
            _reset_peak(device)
            try:
                row = rl_step(learner, batch, s, reward_fn=rewards)
            except torch.OutOfMemoryError:
                learner.optimizer.zero_grad(set_to_none=True)
                out[gc] = "OOM"
                continue
            out[gc] = {"step_s": row.time_rollout + row.time_logprobs + row.time_update, "rollout_s": row.time_rollout,
                       "logprob_s": row.time_logprobs, "update_s": row.time_update,
                       "peak_bytes": row.peak_memory_bytes, "rollout_tokens": row.rollout_tokens}
        return out
    finally:
        set_gradient_checkpointing(policy.model, False)
        learner.optimizer.zero_grad(set_to_none=True)
