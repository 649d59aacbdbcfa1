"""Data parallelism for the RL trainer: process group from torchrun's environment, prompt sharding, reductions.

Why explicit collectives rather than wrapping the policy in DDP: the same module serves the rollout (hundreds of
small no-grad forwards with a KV cache, rows leaving the batch as they finish), the old/reference log-probs (with
the adapter disabled for the KL reference) and the update; and a rank may hold no rows of an off-policy minibatch,
so it runs no backward at all, which DDP's bucketed hooks would wait on forever. Here the trainer computes each
rank's loss with the GLOBAL normaliser (total valid tokens for DAPO, completions with a valid token for GRPO),
runs backward locally, and sums the gradients over ranks with one bucketed all-reduce: the update is that of one
process on the global batch, up to the order of the float additions (tests/rl/test_distributed.py checks it).

Full fine-tuning (`full`) uses the same replicated data parallelism, not FSDP: the rollout loop would all-gather
every layer on each of its hundreds of decode forwards, AQN edits the RMSNorm weights in place (a sharded weight
would get per-shard noise), and the checkpoint and `save_pretrained` paths would need full-state gathering. The
paper trains LoRA methods only on its GPUs, whose trainable state is a few hundred MB; a full fine-tune of a 7B
model must fit one GPU per rank (weights, gradients and AdamW state replicated).

Launch (torchrun and `accelerate launch` set RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT):

    torchrun --nproc_per_node 2 -m qerl.cli train --config ... --out ...
    accelerate launch --multi_gpu --num_processes 2 -m qerl.cli train --config ... --out ...

On one multi-GPU box the DAG runs several GPU jobs side by side (workflow/profiles/local caps their total); each
job claims its own GPUs first, so two jobs never share one (unless `--slots K` lets K jobs share each GPU: config
resources.train.jobs_per_gpu, for models far too small to fill a GPU):

    python -m qerl.rl.distributed --gpus 2 -- torchrun --standalone --nproc_per_node 2 -m qerl.cli train ...

takes an exclusive file lock on 2 free GPUs (waiting while fewer are free), sets CUDA_VISIBLE_DEVICES to them and
execs the command, which holds the locks until it exits. Under SLURM (SLURM_JOB_ID set) the allocation already
chose the GPUs and the command runs as given.

Without those variables everything here is a no-op and the trainer runs as one process. Backend: NCCL when CUDA
is available (one GPU per local rank), gloo otherwise (CPU tests); QERL_DIST_BACKEND=gloo keeps a run on the CPU
even where GPUs exist (the equivalence test does). `QERL_DIST_TIMEOUT_MIN` (default 60) bounds how
long a collective waits for a slow rank (long rollouts on one rank stall the others at the next reduction).
"""
from __future__ import annotations

import argparse
import datetime
import fcntl
import os
import sys
import tempfile
import time
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

__all__ = ["DistContext", "init_distributed", "shutdown", "shard_range", "all_reduce", "reduce_sum",
           "reduce_max", "all_gather_cat", "all_gather_list", "all_reduce_grads", "broadcast_params", "barrier",
           "claim_gpus", "main"]

_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK")
_BUCKET_BYTES = 256 * 2**20  # gradient all-reduce bucket: few launches, bounded extra memory for full fine-tuning


@dataclass(frozen=True)
class DistContext:
    """Where this process sits in the job. The default is the single process: rank 0 of 1, no process group.

    Attributes:
        rank: global rank.
        world_size: number of processes.
        local_rank: rank on this machine (picks the GPU).
        device: this rank's device (cuda:<local_rank> under NCCL, cpu under gloo; None for the single process,
            which keeps whatever device the model was loaded on).
        backend: "nccl", "gloo", or None when no process group exists.
    """

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device | None = field(default=None)
    backend: str | None = None

    @property
    def distributed(self) -> bool:
        """True when a process group exists (even of size 1, as under `torchrun --nproc_per_node 1`)."""
        return self.backend is not None

    @property
    def is_main(self) -> bool:
        """Rank 0: the one process that writes files and prints."""
        return self.rank == 0


def _env_int(name: str) -> int:
    value = os.environ[name]
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"environment variable {name}={value!r} is not an integer (set by torchrun / "
                         f"accelerate launch)") from None


def init_distributed() -> DistContext:
    """The process group of this job, created from the environment on the first call (idempotent).

    Returns:
        DistContext(): no RANK/WORLD_SIZE in the environment and no process group (plain `qerl train`).
        Otherwise the context of this rank; the CUDA device is set to the local rank's GPU.

    Raises:
        ValueError: only some of RANK, WORLD_SIZE, LOCAL_RANK are set, or they are not integers.
        RuntimeError: NCCL would be used but this machine has fewer GPUs than local ranks.
    """
    if dist.is_available() and dist.is_initialized():
        backend = dist.get_backend()
        local = int(os.environ.get("LOCAL_RANK", dist.get_rank()))
        device = torch.device("cuda", local) if backend == "nccl" else torch.device("cpu")
        return DistContext(dist.get_rank(), dist.get_world_size(), local, device, backend)
    present = [k for k in _ENV if k in os.environ]
    if not present:
        return DistContext()
    if len(present) != len(_ENV):
        missing = sorted(set(_ENV) - set(present))
        raise ValueError(f"distributed launch: {', '.join(present)} set but {', '.join(missing)} missing; launch "
                         f"with `torchrun --nproc_per_node N` or `accelerate launch`, or unset them")
    rank, world, local = (_env_int(k) for k in _ENV)
    forced = os.environ.get("QERL_DIST_BACKEND")
    if forced not in (None, "", "nccl", "gloo"):
        raise ValueError(f"QERL_DIST_BACKEND={forced!r}: use nccl or gloo (or unset it)")
    if forced == "gloo" or (not forced and not torch.cuda.is_available()):
        backend, device = "gloo", torch.device("cpu")
    else:
        if local >= torch.cuda.device_count():
            raise RuntimeError(f"local rank {local} has no GPU: this machine has {torch.cuda.device_count()}; "
                               f"lower --nproc_per_node")
        torch.cuda.set_device(local)
        backend, device = "nccl", torch.device("cuda", local)
    timeout = datetime.timedelta(minutes=float(os.environ.get("QERL_DIST_TIMEOUT_MIN", "60")))
    kwargs = {"device_id": device} if backend == "nccl" else {}
    dist.init_process_group(backend, rank=rank, world_size=world, timeout=timeout, **kwargs)
    return DistContext(rank, world, local, device, backend)


def shutdown(ctx: DistContext) -> None:
    """Destroy the process group (local; safe while other ranks are still running)."""
    if ctx.distributed and dist.is_initialized():
        dist.destroy_process_group()


def shard_range(n: int, rank: int, world_size: int) -> tuple[int, int]:
    """The contiguous slice [lo, hi) of n items that `rank` takes; sizes differ by at most one, earlier ranks first.

    Raises:
        ValueError: fewer items than ranks (a rank would have nothing to roll out).
    """
    if n < world_size:
        raise ValueError(f"{n} prompts per step cannot be shared by {world_size} ranks: raise train.prompts_per_step "
                         f"to at least {world_size} or launch fewer processes")
    base, extra = divmod(n, world_size)
    lo = rank * base + min(rank, extra)
    return lo, lo + base + (1 if rank < extra else 0)


def all_reduce(ctx: DistContext, tensor: torch.Tensor, op: str = "sum") -> torch.Tensor:
    """In-place all-reduce ("sum" or "max") of a tensor on ctx.device; the tensor itself without a process group."""
    if ctx.distributed:
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM if op == "sum" else dist.ReduceOp.MAX)
    return tensor


def _reduce_floats(ctx: DistContext, values: list[float], op: str) -> list[float]:
    if not ctx.distributed:
        return list(values)
    t = torch.tensor(values, dtype=torch.float64, device=ctx.device)
    return all_reduce(ctx, t, op).tolist()


def reduce_sum(ctx: DistContext, values: list[float]) -> list[float]:
    """Element-wise sums over ranks of a list of floats (one float64 collective)."""
    return _reduce_floats(ctx, values, "sum")


def reduce_max(ctx: DistContext, values: list[float]) -> list[float]:
    """Element-wise maxima over ranks of a list of floats (timings, peak memory)."""
    return _reduce_floats(ctx, values, "max")


def all_gather_cat(ctx: DistContext, tensor: torch.Tensor) -> torch.Tensor:
    """The 1-D tensors of every rank concatenated in rank order (lengths may differ); the tensor itself alone."""
    if not ctx.distributed:
        return tensor
    parts: list = [None] * ctx.world_size
    torch.distributed.all_gather_object(parts, tensor.detach().cpu())
    return torch.cat(parts)


def all_gather_list(ctx: DistContext, items: list) -> list:
    """The (picklable) lists of every rank concatenated in rank order; the list itself alone."""
    if not ctx.distributed:
        return items
    parts: list = [None] * ctx.world_size
    torch.distributed.all_gather_object(parts, items)
    return [x for part in parts for x in part]


def all_reduce_grads(ctx: DistContext, params: list[torch.nn.Parameter]) -> None:
    """Sum the gradients of `params` over ranks, in place.

    A parameter whose gradient is None on every rank stays None (so the optimizer skips it exactly as one process
    would); one that has a gradient on some rank only (another rank had no rows in this minibatch) gets zeros
    elsewhere before the sum.
    """
    if not ctx.distributed:
        return
    has = torch.tensor([p.grad is not None for p in params], dtype=torch.float32, device=ctx.device)
    all_reduce(ctx, has, "max")
    live = [p for p, h in zip(params, has.tolist()) if h > 0]
    for p in live:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    buckets: list[list[torch.nn.Parameter]] = []
    size = 0
    for p in live:
        nbytes = p.grad.numel() * p.grad.element_size()
        if not buckets or p.grad.dtype != buckets[-1][0].grad.dtype or size + nbytes > _BUCKET_BYTES:
            buckets.append([])
            size = 0
        buckets[-1].append(p)
        size += nbytes
    for bucket in buckets:
        flat = torch.cat([q.grad.reshape(-1) for q in bucket])  # [sum of numel]
        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        offset = 0
        for q in bucket:
            q.grad.copy_(flat[offset : offset + q.grad.numel()].view_as(q.grad))
            offset += q.grad.numel()


@torch.no_grad()
def broadcast_params(ctx: DistContext, params: list[torch.nn.Parameter]) -> None:
    """Copy rank 0's values of `params` to every rank (the trainable weights start identical everywhere)."""
    if not ctx.distributed:
        return
    for p in params:
        dist.broadcast(p.data, src=0)


def barrier(ctx: DistContext) -> None:
    """Wait for every rank (no-op for one process)."""
    if ctx.distributed:
        if ctx.backend == "nccl":
            dist.barrier(device_ids=[ctx.local_rank])
        else:
            dist.barrier()


def _lock_names(gpu: str, slots: int) -> list[str]:
    """The lock files of one GPU: gpu<id>.lock for exclusive use, gpu<id>.slot<k>.lock when `slots` jobs share it."""
    return [f"gpu{gpu}.lock"] if slots == 1 else [f"gpu{gpu}.slot{k}.lock" for k in range(slots)]


def claim_gpus(n: int, visible: list[str], lock_dir: str | os.PathLike, poll_s: float = 5.0,
               timeout_s: float | None = None, slots: int = 1) -> tuple[list[str], list[int]]:
    """Locks on a slot of each of `n` of the `visible` GPU ids (files in `lock_dir`), waiting until n have one free.

    Args:
        slots: how many jobs may share one GPU (config resources.train.jobs_per_gpu); 1 = exclusive.

    Returns:
        (the claimed ids, their open lock file descriptors, inheritable: the locks live as long as they stay open).

    Raises:
        RuntimeError: fewer than n GPUs exist, or timeout_s passed without n free ones.
    """
    if n > len(visible):
        raise RuntimeError(f"a job asks for {n} GPUs but this machine has {len(visible)} ({visible}); lower "
                           f"resources.train.gpus or the local profile's `resources: gpu=` cap")
    if slots < 1:
        raise ValueError(f"resources.train.jobs_per_gpu must be >= 1, got {slots}")
    os.makedirs(lock_dir, exist_ok=True)
    start = time.monotonic()
    while True:
        ids, fds = [], []
        for gpu in visible:
            for name in _lock_names(gpu, slots):
                fd = os.open(os.path.join(lock_dir, name), os.O_CREAT | os.O_RDWR, 0o666)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    os.close(fd)
                    continue
                ids.append(gpu)
                fds.append(fd)
                break
            if len(ids) == n:
                for f in fds:
                    os.set_inheritable(f, True)
                return ids, fds
        for f in fds:
            os.close(f)  # releases the partial claim, so two waiting jobs cannot deadlock
        if timeout_s is not None and time.monotonic() - start > timeout_s:
            raise RuntimeError(f"no {n} free GPUs among {visible} after {timeout_s:.0f} s (locks in {lock_dir})")
        time.sleep(poll_s)


def main(argv: list[str] | None = None) -> int:
    """`python -m qerl.rl.distributed --gpus N -- COMMAND...`: run COMMAND on N GPUs claimed for it alone."""
    parser = argparse.ArgumentParser(prog="python -m qerl.rl.distributed", description=main.__doc__)
    parser.add_argument("--gpus", type=int, required=True, help="GPUs the command needs")
    parser.add_argument("--slots", type=int, default=1, help="jobs that may share one GPU (1: exclusive)")
    parser.add_argument("--lock-dir", default=os.path.join(tempfile.gettempdir(), "qerl-gpu-locks"),
                        help="folder of the per-GPU lock files (node-local)")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the command, after --")
    args = parser.parse_args(argv)
    cmd = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not cmd:
        parser.error("no command given after --")
    env = dict(os.environ)
    if args.gpus > 0 and "SLURM_JOB_ID" not in env:
        if env.get("CUDA_VISIBLE_DEVICES"):
            visible = [v.strip() for v in env["CUDA_VISIBLE_DEVICES"].split(",") if v.strip()]
        else:
            visible = [str(i) for i in range(torch.cuda.device_count())]
        ids, _ = claim_gpus(args.gpus, visible, args.lock_dir, slots=args.slots)
        env["CUDA_VISIBLE_DEVICES"] = ",".join(ids)
        print(f"qerl.rl.distributed: CUDA_VISIBLE_DEVICES={env['CUDA_VISIBLE_DEVICES']}", file=sys.stderr)
    os.execvpe(cmd[0], cmd, env)
    return 0  # not reached


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
