"""Resumable checkpoints of a training run: what they hold, when one belongs to the run, and how a run resumes.

Why: a killed run (preemption, a SIGKILL, Snakemake's cleanup of a failed job) must continue identically. Sampling,
data order and AQN noise are seeded by (seed, step), so the checkpoint needs only the trainable weights, the
optimizer and scheduler state, the count of consecutive bad steps, and the metrics lines written so far: Snakemake
deletes metrics.jsonl (a declared output) when a job fails or is rerun as incomplete, while checkpoint.pt
(deliberately not an output) survives, so the resumed job rewrites the whole history from the checkpoint. A
checkpoint written for other settings or other input files (base model, quantized checkpoint, training problems)
is ignored: the run starts from step 0, as the rerun Snakemake started for that change expects. A resumed run says
so, and from which step, on stderr (the job's log).

Run the tests: `pytest tests/rl/test_trainer.py -q -k resume`.
"""
from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import torch

from qerl.io import atomic_file, write_text
from qerl.rl.settings import RunSettings
from qerl.rl.step import Learner

__all__ = ["run_identity", "save_checkpoint", "resume"]


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


def save_checkpoint(path: Path, learner: Learner, step: int, bad: int, history: list[str], identity: dict) -> None:
    """Write the resumable state after `step` steps, atomically.

    Args:
        path: the checkpoint file.
        learner: the policy, optimizer and scheduler.
        step: steps done.
        bad: consecutive steps with a skipped (non-finite) update so far.
        history: the metrics lines of steps 0 .. step - 1.
        identity: run_identity of the run.
    """
    assert len(history) == step, (len(history), step)
    state = {"step": step, "bad_streak": bad, "optimizer": learner.optimizer.state_dict(),
             "scheduler": learner.scheduler.state_dict(),
             "trainable": {n: p.detach().clone() for n, p in learner.model.named_parameters() if p.requires_grad},
             "history": list(history), "identity": identity}
    with atomic_file(path) as tmp:
        torch.save(state, tmp)


def _load(state: dict, learner: Learner) -> tuple[int, int]:
    params = dict(learner.model.named_parameters())
    with torch.no_grad():
        for name, value in state["trainable"].items():
            params[name].copy_(value)
    learner.optimizer.load_state_dict(state["optimizer"])
    learner.scheduler.load_state_dict(state["scheduler"])
    return state["step"], state["bad_streak"]


def resume(ckpt: Path, metrics_path: Path, learner: Learner, identity: dict, total_steps: int,
           is_main: bool) -> tuple[int, int, list[str]]:
    """Load `ckpt` if it belongs to this run and put its metrics history back into metrics.jsonl (rank 0).

    Args:
        ckpt: the run's checkpoint file (absent: a fresh run).
        metrics_path: the run's metrics.jsonl.
        learner: the policy, optimizer and scheduler to restore.
        identity: run_identity of this run.
        total_steps: the run's steps (for the message).
        is_main: rank 0 (the one that writes files and messages).

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
            start, bad = _load(state, learner)
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
