"""Rollout samples on disk: the completions behind a run's reward curve, beside metrics.jsonl.

Why: a reviewer who doubts a reward curve, or a reproducer who sees the reward collapse at step 300, wants to read
what the policy wrote (verl's rollout_data_dir does the same). Each kept step is one gzip-compressed JSON Lines
chunk, <run>/rollouts/step<k>.jsonl.gz (qerl.contract.paths.rollout_chunk), one qerl.contract.records.RolloutSample
per completion, written atomically (qerl/io.py): a killed run never leaves a half chunk. Read them with
`zcat <run>/rollouts/*.jsonl.gz` or qerl.contract.records.read_rollouts.

What is kept (config train.rollout_samples): every `every`-th step (steps 0, every, 2 every, ...) and the last one,
and of each kept step the first ceil(share x prompts_per_step) prompts of the step's batch with all their group_size
completions (a GRPO group is read whole). `every: 0` keeps none.

Resume: a chunk depends only on (seed, step) and the weights, which the checkpoint restores, so a resumed run drops
the chunks of the steps it is about to run again (`drop_from`) and rewrites them identically; the folder of a
resumed run equals an uninterrupted run's. The folder is deliberately not a Snakemake output (as checkpoint.pt):
Snakemake would delete it with a failed job's outputs, and the chunks of the steps before the checkpoint would be
lost. gzip's header carries no time stamp or file name here, so equal samples give equal bytes.

Run the tests: `pytest tests/rl/test_rollout_log.py -q`.
"""
from __future__ import annotations

import gzip
import math
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from qerl.contract.paths import ROLLOUTS_DIR, rollout_chunk, rollout_chunks
from qerl.contract.records import RolloutSample
from qerl.io import write_bytes

__all__ = ["RolloutKeep", "rollout_keep", "step_samples", "write_chunk", "drop_from"]


@dataclass(frozen=True)
class RolloutKeep:
    """Which rollout samples a run writes (config train.rollout_samples).

    Attributes:
        every: keep steps 0, every, 2 every, ... and the last step; 0 keeps none.
        share: the fraction of each kept step's prompts whose completions are written (at least one prompt).
        steps: the run's steps (the last one is always kept).
    """

    every: int
    share: float
    steps: int

    def keeps(self, step: int) -> bool:
        """Whether the samples of `step` are written."""
        return self.every > 0 and (step % self.every == 0 or step == self.steps - 1)

    def prompts(self, prompts_per_step: int) -> int:
        """How many of a kept step's prompts (the first ones of the batch) are written."""
        return min(prompts_per_step, max(1, math.ceil(self.share * prompts_per_step)))


def rollout_keep(cfg: dict, steps: int) -> RolloutKeep:
    """The RolloutKeep of a validated config's train.rollout_samples for a run of `steps` steps."""
    spec = cfg["train"]["rollout_samples"]
    return RolloutKeep(every=spec["every"], share=spec["share"], steps=steps)


def step_samples(step: int, prompt_ids: list[str], golds: list[str], group_size: int, texts: list[str],
                 results: list, lengths: torch.Tensor, truncated: torch.Tensor, sample_logp: torch.Tensor,
                 entropy: torch.Tensor, completion_mask: torch.Tensor, sigma: float) -> list[RolloutSample]:
    """One RolloutSample per rollout row (row i is sample i % G of prompt i // G).

    Args:
        step: the training step.
        prompt_ids, golds: per prompt.
        group_size: G.
        texts, results: per row: the completion and its reward result (.reward, .correct).
        lengths, truncated: [n] per row.
        sample_logp, entropy, completion_mask: [n, L] per completion token (mask 1 on sampled tokens).
        sigma: the step's AQN sigma.
    """
    mask = completion_mask.detach().float().cpu()
    count = mask.sum(1).clamp(min=1)
    logp = ((sample_logp.detach().float().cpu() * mask).sum(1) / count).tolist()
    ent = ((entropy.detach().float().cpu() * mask).sum(1) / count).tolist()
    lens, cut = lengths.tolist(), truncated.tolist()
    return [RolloutSample(step=step, prompt_id=prompt_ids[i // group_size], sample=i % group_size,
                          gold=golds[i // group_size], completion=texts[i], reward=float(results[i].reward),
                          correct=bool(results[i].correct), length=int(lens[i]), truncated=bool(cut[i]),
                          logprob_mean=logp[i], entropy=ent[i], sigma=float(sigma))
            for i in range(len(texts))]


def write_chunk(run: str | Path, step: int, samples: list[RolloutSample]) -> Path:
    """Write one step's samples to <run>/rollouts/step<k>.jsonl.gz atomically, reproducibly compressed."""
    data = "".join(s.to_json() + "\n" for s in samples).encode("utf-8")
    return write_bytes(rollout_chunk(run, step), gzip.compress(data, compresslevel=6, mtime=0))


def drop_from(run: str | Path, start: int, keep: RolloutKeep, say: bool = True) -> list[int]:
    """Before a run continues at `start`: delete the chunks of steps >= start (they will be written again) and
    report the kept steps before `start` whose chunk is missing (deleted by hand: they cannot be recovered).

    Returns:
        The missing steps (a note on stderr names them when `say`).
    """
    folder = Path(run) / ROLLOUTS_DIR
    on_disk = dict(rollout_chunks(folder))
    for step, path in on_disk.items():
        if step >= start:
            path.unlink()
    missing = [k for k in range(start) if keep.keeps(k) and k not in on_disk]
    if missing and say:
        print(f"qerl train: {folder} lacks the rollout samples of step(s) {missing} before step {start} (deleted?); "
              f"they are not recovered: delete the checkpoint to train from step 0 and write them all",
              file=sys.stderr, flush=True)
    return missing
