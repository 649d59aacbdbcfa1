"""Rollout throughput, GRPO step time and memory of lora / qlora / qerl at the paper's shapes.

What is measured (one process, one GPU, random weights of the real architectures, qerl.profiling.build; every
model is built by the policy core from the run's settings, qerl/profiling/e2e.py):
  * model size: bytes of the base weights (4-bit codes, scales, and what stays BF16: embeddings, LM head, norms,
    biases; NF4's absmax constants included; LoRA excluded), as in the paper's "model size" column.
  * rollout tokens/s (rollout.csv): prompt 256 tokens, completion forced to 2048 tokens (no EOS), as the paper's
    Tables 5-9, with our engine (qerl.rl.engine: static KV cache, CUDA graphs per 512-slot attention bucket,
    grouped q/k/v and gate/up launches for NVFP4). Two timings:
      - `full`: one complete generation, timed end to end (prefill + 2047 decode steps);
      - `buckets`: each bucket's graph replayed `reps` times; the generation time is prefill + the sum over buckets
        of (steps that fall in the bucket x the bucket's step time). A generation replays exactly those graphs, so
        this is the same work at a fraction of the device time; `full` rows of the same config validate it.
  * GRPO step (e2e.csv): the trainer's own step, `qerl.rl.step.rl_step` (qerl/profiling/e2e.py): rollout of one
    random-token prompt x batch samples through the trainer's sampler (up to --completion tokens), old-policy and
    reference log-probs as the task asks, and the task's updates with the run's optimizer, schedule, LoRA alpha
    and AQN, from --config / --task (default: config/paper.yaml, its first GRPO task); timed without and with
    gradient checkpointing after one warm-up step; rollout_s, logprob_s and update_s are the step's phases
    (between device synchronisations) and step_s their sum. Out-of-memory is recorded as OOM (the run goes on).
  * peak GPU memory per (model, method) (memory.csv): the peak of the GRPO step at batch 2 with gradient
    checkpointing (the paper's 32B setting), and every step's peak in e2e.csv.
Also, for reference, transformers' own `generate` (dynamic cache) at batch 1 and 8 for a short completion
(rollout_hf.csv).

Run (GPU; qerl/commands/profile.py): `qerl profile --archs 7B 3B --out WORK [--publish DIR]`; rows are appended to
WORK's CSVs and a config already there is skipped, so a run cut by a time limit resumes where it stopped (`--budget-s`
stops starting new configs after that many seconds); once every config is measured, --publish copies the CSVs to DIR.
The DAG's rule `profile` writes results/<scale>/measured/<gpu>/ this way (work folder `partial/` beside it);
committing a measurement to results/measured/<gpu>/ (what the tables read) is a separate step, `python -m
qerl.profiling.commit`, which keeps every earlier file.

Batch sweep: --batches defaults to 1, 2, 4, ..., 256 (the speed claim across batch sizes; the paper's rollouts run
64-row chunks of 128 prompts x 8 samples).
"""
from __future__ import annotations

import csv
import gc
import json
import os
import time
from pathlib import Path

import torch

from qerl.contract.measured import E2E, MEASURED_CSVS, MEMORY, ROLLOUT, ROLLOUT_HF, MeasuredCsv

__all__ = ["profile", "model_size_bytes", "rollout_timing", "hf_generate_timing", "publish"]



def _now() -> float:
    torch.cuda.synchronize()
    return time.perf_counter()


class _Csv:
    """Append-only measured CSV (qerl.contract.measured) with its resume key: rows already there are not measured
    again."""

    def __init__(self, folder: Path, spec: MeasuredCsv):
        path = Path(folder) / spec.name
        self.path, self.cols, self.key = path, spec.columns, spec.key
        self.done = set()
        if path.exists():
            with open(path) as f:
                for r in csv.DictReader(f):
                    self.done.add(tuple(str(r[k]) for k in self.key))
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(path, "w", newline="") as f:
                csv.writer(f).writerow(self.cols)

    def has(self, **kw) -> bool:
        return tuple(str(kw[k]) for k in self.key) in self.done

    def add(self, **row) -> None:
        with open(self.path, "a", newline="") as f:
            csv.writer(f).writerow([_fmt(row.get(c, "")) for c in self.cols])
        self.done.add(tuple(str(row[k]) for k in self.key))
        print(json.dumps({k: _fmt(v) for k, v in row.items()}), flush=True)


def _fmt(v):
    return f"{v:.4g}" if isinstance(v, float) else v


def _free():
    gc.collect()
    torch.cuda.empty_cache()


def record_dispatch(out: Path, label: str, model) -> dict:
    """Add the 4-bit kernels' dispatch choices made so far in this process (qerl_kernels.fp4_launch.dispatch_table:
    shape, M bucket, dtype, format, ... -> path; earlier 4-bit models' included, the table is per process) to
    out/dispatch.json under `label`, so a rollout's numbers can be read with the kernels that made them; {} for a
    model without 4-bit layers (QuantLinear), whose rollouts launch none of them. Returns the file's content."""
    from qerl.layers import QuantLinear
    from qerl_kernels.fp4_launch import dispatch_table

    path = Path(out) / "dispatch.json"
    table = json.loads(path.read_text()) if path.is_file() else {}
    four_bit = any(isinstance(m, QuantLinear) for m in model.modules())
    table[label] = {str(k): v for k, v in dispatch_table().items()} if four_bit else {}
    path.write_text(json.dumps(table, indent=1, sort_keys=True) + "\n")
    return table


def _oom(where: str, exc: BaseException) -> None:
    print(f"# OOM in {where}: {str(exc).splitlines()[0][:300]} (allocated "
          f"{_gb(torch.cuda.memory_allocated()):.1f} GB, reserved {_gb(torch.cuda.memory_reserved()):.1f} GB)",
          flush=True)


def model_size_bytes(model) -> int:
    """Base weights only (no LoRA), counting NF4 absmax constants."""
    from qerl.policy import weight_nbytes

    total = weight_nbytes(model)
    for n, p in model.named_parameters():
        if "lora_" in n:
            total -= p.numel() * p.element_size()
    return total


def _prompts(batch: int, plen: int, vocab: int, seed: int = 0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    ids = torch.randint(0, vocab, (batch, plen), device="cuda", generator=g)
    return ids, torch.ones_like(ids)


def rollout_timing(model, batch: int, plen: int, completion: int, *, full: bool, reps: int = 8) -> dict:
    """Measure one rollout configuration (see the module docstring); returns the timing fields."""
    from qerl.rl.engine import DecodeEngine

    vocab = model.config.vocab_size
    torch.cuda.reset_peak_memory_stats()
    eng = DecodeEngine(model, batch, plen + completion, bucket=512)
    ids, attn = _prompts(batch, plen, vocab)
    t0 = _now()
    n_graphs = eng.capture(plen, completion)
    capture_s = _now() - t0
    eng.generate(ids, attn, max_new_tokens=8, force_length=True)  # warm prefill
    t0 = _now()
    for _ in range(2):
        eng.prefill(ids, attn)
    prefill_s = (_now() - t0) / 2
    if full:
        torch.manual_seed(0)
        t0 = _now()
        eng.generate(ids, attn, max_new_tokens=completion, force_length=True)
        total = _now() - t0
        decode_s = total - prefill_s
    else:
        eng.prefill(ids, attn)
        decode_s = sum(steps * eng.step_seconds(span, reps) for span, steps in eng.spans(plen, completion).items())
        total = prefill_s + decode_s
    peak = torch.cuda.max_memory_allocated()
    del eng
    _free()
    return dict(peak=peak, tokens_per_s=batch * completion / total, timing="full" if full else "buckets",
                prompt_tokens=plen, completion_tokens=completion, prefill_s=prefill_s, decode_s=decode_s,
                graphs=n_graphs, capture_s=capture_s)


def hf_generate_timing(model, batch: int, plen: int, completion: int) -> float:
    """tokens/s of transformers' generate (dynamic cache, sampling, forced length) on the same model."""
    ids, attn = _prompts(batch, plen, model.config.vocab_size)
    kw = dict(do_sample=True, temperature=1.0, top_p=1.0, top_k=0, min_new_tokens=completion,
              max_new_tokens=completion, pad_token_id=0, eos_token_id=None)
    model.generate(input_ids=ids, attention_mask=attn, **{**kw, "min_new_tokens": 4, "max_new_tokens": 4})
    t0 = _now()
    out = model.generate(input_ids=ids, attention_mask=attn, **kw)
    dt = _now() - t0
    return batch * (out.shape[1] - plen) / dt


def _gb(x: int) -> float:
    return x / 1e9


def profile(cfg: dict, out: str | Path, *, archs: list[str], methods: list[str], ranks: list[int],
            batches: list[int], full_batches: list[int], e2e_batches: list[int], prompt: int = 256,
            completion: int = 2048, hf_batches: list[int] = (), hf_completion: int = 128, layers: int | None = None,
            task: str | None = None, budget_s: float = 0, publish_to: str | Path | None = None) -> bool:
    """Measure every configuration not yet in `out`'s CSVs (module docstring; the options are `qerl profile`'s).

    Returns:
        True when every configuration is measured (and, with `publish_to`, the CSVs copied there); False when
        `budget_s` ran out first (rerun to resume).

    Raises:
        ValueError: no CUDA device; the GRPO step's optimizer unavailable (adamw8bit without bitsandbytes) when
            `e2e_batches` asks for it, before anything is measured.
    """
    from qerl.contract.methods import get_method
    from qerl.profiling.archs import ARCHS
    from qerl.profiling.build import random_base
    from qerl.profiling.e2e import RandomPromptTokenizer, default_task, e2e_timing, profile_settings
    from qerl.rl.settings import build_run_policy, check_optimizer

    os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    task = task or default_task(cfg)
    for method in methods if e2e_batches else ():  # the GRPO step builds its optimizer after every rollout: check now
        try:
            check_optimizer(profile_settings(cfg, task, method, rank=ranks[0], batch=e2e_batches[0],
                                            completion=completion))
        except RuntimeError as exc:
            raise ValueError(f"{exc} in --config, or time rollouts only: --e2e-batches with no values") from exc
    if not torch.cuda.is_available():
        raise ValueError("qerl profile measures GPU throughput and memory, and no CUDA device is visible")
    out = Path(out)
    rollout, e2e, memory, hf = (_Csv(out, spec) for spec in (ROLLOUT, E2E, MEMORY, ROLLOUT_HF))
    start = time.perf_counter()
    plen, comp = prompt, completion

    def over() -> bool:
        return budget_s and time.perf_counter() - start > budget_s

    for arch in archs:
        a = ARCHS[arch]
        name = a.model_name
        tokenizer = RandomPromptTokenizer(a.vocab, plen, pad_token_id=151643)
        for method in methods:
            if over():
                print(f"budget of {budget_s} s reached; stopping (rerun to resume)", flush=True)
                return False
            _free()
            torch.cuda.reset_peak_memory_stats()
            before = torch.cuda.memory_allocated()
            t0 = time.perf_counter()
            try:
                base = random_base(arch, get_method(method).weights, layers=layers, device="cuda")
            except torch.cuda.OutOfMemoryError as exc:
                _oom(f"building {name} {method}", exc)
                memory.add(model=name, method=method, model_size_gb="OOM", peak_gb="OOM")
                _free()
                continue
            size = model_size_bytes(base)
            print(f"# built {name} {method}: {_gb(size):.2f} GB weights "
                  f"({_gb(torch.cuda.memory_allocated() - before):.2f} GB allocated) in "
                  f"{time.perf_counter() - t0:.0f} s", flush=True)
            main_rank = 32 if 32 in ranks else ranks[0]
            policy = None
            order = [r for r in ranks if r != main_rank] + [main_rank]  # the GRPO step uses the main rank
            timed = False  # a rollout of this model measured in this process (else its dispatch entry is kept)
            for rank in order:
                s = profile_settings(cfg, task, method, rank=rank, batch=1, completion=comp)
                policy = build_run_policy(s, base, tokenizer=tokenizer)
                model = policy.model
                rank_batches = batches if rank == main_rank else [1]  # the other ranks: batch 1 only
                for batch in rank_batches:
                    for full in ([False, True] if (rank == main_rank and batch in full_batches) else [False]):
                        key = dict(model=name, method=method, rank=rank, batch=batch,
                                   timing="full" if full else "buckets")
                        if rollout.has(**key) or over():
                            continue
                        try:
                            r = rollout_timing(model, batch, plen, comp, full=full)
                        except torch.cuda.OutOfMemoryError as exc:
                            _oom(f"rollout {key}", exc)
                            _free()
                            rollout.add(**key, tokens_per_s="OOM")
                            continue
                        rollout.add(**key, **{k: v for k, v in r.items() if k not in ("timing", "peak")})
                        timed = True
                if rank == main_rank and timed:
                    record_dispatch(out, f"{name}/{method}", model)
                if rank == main_rank and hf_batches:
                    for batch in hf_batches:
                        if not hf.has(model=name, method=method, batch=batch) and not over():
                            tps = hf_generate_timing(model, batch, plen, hf_completion)
                            hf.add(model=name, method=method, rank=rank, batch=batch, tokens_per_s=tps,
                                   completion_tokens=hf_completion)
                if rank != order[-1]:
                    base = model.unload() if get_method(method).trainable == "lora" else model
                    policy = model = None
                    _free()
            mem_peak = None
            for batch in e2e_batches:
                todo = [g for g in (False, True)
                        if not e2e.has(model=name, method=method, batch=batch, gradient_checkpointing=g)]
                if not todo or over():
                    continue
                s = profile_settings(cfg, task, method, rank=main_rank, batch=batch, completion=comp)
                try:
                    timings = e2e_timing(policy, s, gcs=tuple(todo))
                except torch.cuda.OutOfMemoryError as exc:
                    _oom(f"GRPO step warm-up {name} {method} batch {batch}", exc)
                    timings = {g: "OOM" for g in todo}
                _free()
                for gc_on, t in timings.items():
                    key = dict(model=name, method=method, batch=batch, gradient_checkpointing=gc_on)
                    if t == "OOM":
                        e2e.add(**key, rank=main_rank, step_s="OOM", rollout_s="OOM", logprob_s="", update_s="",
                                peak_gb="OOM")
                    else:
                        e2e.add(**key, rank=main_rank, step_s=t["step_s"], rollout_s=t["rollout_s"],
                                logprob_s=t["logprob_s"], update_s=t["update_s"], peak_gb=_gb(t["peak_bytes"]))
                    if batch == 2 and gc_on:
                        mem_peak = t if t == "OOM" else t["peak_bytes"]
            if not memory.has(model=name, method=method) and mem_peak is not None:
                memory.add(model=name, method=method, model_size_gb=_gb(size),
                           peak_gb=_gb(mem_peak) if isinstance(mem_peak, int) else mem_peak,
                           batch=2, gradient_checkpointing=True)
            # every name bound to this method's model let go before the next one is built: `model` kept the last
            # rank's alive (a 32B BF16 model's 65 GB) and the next method's build ran out of memory (H100, call 104)
            policy = model = base = None
            _free()
    if over():
        print(f"budget of {budget_s} s reached; stopping (rerun to resume)", flush=True)
        return False
    if publish_to:
        publish(out, Path(publish_to))
    return True


def publish(work: Path, dest: Path) -> None:
    """Copy the finished CSVs from the work folder to `dest` (each written atomically: temp file, then rename)."""
    import shutil

    from qerl.io import atomic_file

    dest.mkdir(parents=True, exist_ok=True)
    for name in MEASURED_CSVS:
        if (work / name).exists():
            with atomic_file(dest / name) as tmp:
                shutil.copyfile(work / name, tmp)
