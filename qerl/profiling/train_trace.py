"""Where the seconds of a training step go on a config's own model and task, phase by phase; and where a non-finite
loss comes from.

Why: the small scale's GRPO step took 4.0 s (BF16 LoRA) and 5.7 s (QeRL) on an H100 for a 135M-parameter model,
whose arithmetic is a few tens of milliseconds; the DAG's budget depends on knowing whether a phase is launch-bound
(kernels many and short, the GPU mostly idle), arithmetic-bound or waiting on the host. This tool runs the trainer's
own step (`qerl.rl.step.rl_step`, the run's settings, policy and optimizer, real prompts of the task) for a few steps
per method and profiles the last one with the torch profiler: per phase (rollout, log-probs, update: the ranges
rl_step names) the wall time, the CUDA kernels launched, their summed time, the time the GPU was busy (union of
kernel intervals) and the top kernels. With `--check-finite` every step also records where a non-finite value first
appears: the first module whose forward output holds one (and whether only padding positions do), each minibatch's
loss and its inputs' ranges, and non-finite gradient norms.

Run (GPU; the checkpoints are the DAG's):
    python -m qerl.profiling.train_trace --config config/small.yaml --task gsm8k --methods lora qerl \\
        --base results/small/models/smollm2-135m/base --quantized-root results/small/quantized/smollm2-135m \\
        --steps 3 --out trace.json --md trace.md [--check-finite] [--gc on|off]
Output: one JSON object per method (printed, and a list in --out) and a Markdown table (--md).
"""
from __future__ import annotations

import argparse
import json
import math
import time
from collections import defaultdict
from dataclasses import replace
from pathlib import Path

import torch

from qerl.args import add_list

__all__ = ["PHASES", "phase_summary", "trace_method", "main"]

#: the record_function ranges of qerl.rl.step.rl_step, in step order
PHASES = ("rl_step.rollout", "rl_step.logprobs", "rl_step.update")


def _merged_us(intervals: list[tuple[float, float]]) -> float:
    """Length of the union of [start, end) intervals (us)."""
    total, end = 0.0, -math.inf
    for s, e in sorted(intervals):
        if s > end:
            total += e - s
            end = e
        elif e > end:
            total += e - end
            end = e
    return total


def phase_summary(events, phases=PHASES, top: int = 8) -> dict:
    """Per phase: wall us (the range), kernels launched, summed kernel us, GPU-busy us and the top kernels.

    Kernels belong to the phase whose window holds their start: a phase's window runs from its range's start to the
    next phase's (the last: to the end). rl_step synchronises the device between phases, so a phase's kernels, even
    those still queued when its host range closes, start inside its window.

    Args:
        events: torch.profiler's `prof.events()`.
        phases: the record_function names to split by.
        top: kernels listed per phase.
    """
    found = sorted((e.time_range.start, e.time_range.end, e.name) for e in events if e.name in phases)
    kernels = [e for e in events if e.device_type == torch.autograd.DeviceType.CUDA and e.name not in phases]
    out = {}
    for i, (lo, hi, name) in enumerate(found):
        stop = found[i + 1][0] if i + 1 < len(found) else math.inf
        ks = [k for k in kernels if lo <= k.time_range.start < stop]
        by_name: dict = defaultdict(lambda: [0, 0.0])
        for k in ks:
            by_name[k.name][0] += 1
            by_name[k.name][1] += k.time_range.end - k.time_range.start
        kernel_us = sum(v[1] for v in by_name.values())
        busy = _merged_us([(k.time_range.start, k.time_range.end) for k in ks])
        hi = max([hi] + [k.time_range.end for k in ks])  # the host range, or its last kernel's end
        out[name.split(".")[-1]] = {
            "wall_ms": round((hi - lo) / 1e3, 2), "kernels": len(ks), "kernel_ms": round(kernel_us / 1e3, 2),
            "busy_ms": round(busy / 1e3, 2), "busy_fraction": round(busy / max(hi - lo, 1e-9), 3),
            "mean_kernel_us": round(kernel_us / max(len(ks), 1), 2),
            "top": [(n[:90], c, round(us / 1e3, 2)) for n, (c, us) in
                    sorted(by_name.items(), key=lambda kv: -kv[1][1])[:top]]}
    return out


class _FiniteWatch:
    """Forward hooks on every module and wrappers of the losses and the gradient clip, recording the first
    non-finite value of each step (see the module docstring). `install()` / `remove()`."""

    def __init__(self, model):
        self.model, self.handles, self.saved, self.records, self.step = model, [], {}, [], -1
        self.mask, self.seen, self.seen_step = None, 0, -1

    def _pre(self, module, args, kwargs):
        m = kwargs.get("attention_mask")
        self.mask = m if torch.is_tensor(m) and m.dim() == 2 else None

    def _hook(self, name):
        def f(module, args, output):
            if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
                return  # the rollout engine capturing a CUDA graph: no host reads inside a capture
            t = output[0] if isinstance(output, (tuple, list)) else getattr(output, "logits", output)
            if torch.is_tensor(t) and t.requires_grad and torch.is_grad_enabled():
                t.register_hook(self._grad_hook(name))
            if not torch.is_tensor(t) or not t.is_floating_point() or bool(torch.isfinite(t).all()):
                return
            if any(r["step"] == self.step and r["kind"] == "forward" for r in self.records):
                return  # the first module of this step is enough
            bad = ~torch.isfinite(t)
            pos = bad.reshape(*bad.shape[:2], -1).any(-1) if bad.dim() >= 3 else None  # [N, T]
            only_pad = None
            if pos is not None and self.mask is not None and self.mask.shape == pos.shape:
                only_pad = bool((pos & self.mask.bool()).sum() == 0)
            self.records.append({"step": self.step, "kind": "forward", "module": name, "dtype": str(t.dtype),
                                 "shape": list(t.shape), "nonfinite": int(bad.sum()),
                                 "rows": sorted(set(pos.nonzero()[:, 0].tolist()))[:16] if pos is not None else None,
                                 "only_padding": only_pad, "grad": torch.is_grad_enabled()})
        return f

    def _grad_hook(self, name):
        """The gradient reaching a module's output in the backward: the first ones of a step that hold a non-finite
        value are recorded in backward order ("backward" records; `seq`: the gradient's place in the step's backward,
        from 1), so the first names the module just after the one whose backward made it (gradients flow from the
        loss)."""
        def f(grad):
            if self.seen_step != self.step:
                self.seen, self.seen_step = 0, self.step
            self.seen += 1
            if torch.isfinite(grad).all():
                return
            if sum(r["step"] == self.step and r["kind"] == "backward" for r in self.records) >= 4:
                return
            bad = ~torch.isfinite(grad)
            self.records.append({"step": self.step, "kind": "backward", "module": name, "seq": self.seen,
                                 "shape": list(grad.shape), "nonfinite": int(bad.sum()),
                                 "nan": int(torch.isnan(grad).sum())})
        return f

    def install(self):
        import qerl.rl.step as step_mod

        self.handles.append(self.model.register_forward_pre_hook(self._pre, with_kwargs=True))
        for name, mod in self.model.named_modules():
            if name:
                self.handles.append(mod.register_forward_hook(self._hook(name)))
        for fn in ("grpo_loss", "dapo_loss"):
            orig = getattr(step_mod, fn)
            self.saved[fn] = orig

            def wrapped(logp, old, adv, mask, *a, _orig=orig, _fn=fn, **k):
                loss, diag = _orig(logp, old, adv, mask, *a, **k)
                v = mask.bool()
                lv, ov = logp.detach()[v], old[v]
                self.records.append({"step": self.step, "kind": "loss", "fn": _fn, "loss": float(loss.detach()),
                                     "valid_tokens": int(v.sum()), "logp_min": float(lv.min()) if lv.numel() else None,
                                     "logp_nonfinite": int((~torch.isfinite(lv)).sum()),
                                     "old_min": float(ov.min()) if ov.numel() else None,
                                     "old_nonfinite": int((~torch.isfinite(ov)).sum()),
                                     "log_ratio_max": float((lv - ov).abs().max()) if lv.numel() else None,
                                     "adv_abs_max": float(adv.abs().max()), "adv_nonfinite": int((~torch.isfinite(adv)).sum())})
                return loss, diag
            setattr(step_mod, fn, wrapped)
        clip = torch.nn.utils.clip_grad_norm_
        self.saved["clip"] = clip

        def clip_wrapped(params, max_norm, *a, **k):
            params = list(params)
            norm = clip(params, max_norm, *a, **k)
            if not math.isfinite(float(norm)):
                names = {id(p): n for n, p in self.model.named_parameters()}
                bad = [names.get(id(p), "?") for p in params if p.grad is not None and not bool(torch.isfinite(p.grad).all())]
                self.records.append({"step": self.step, "kind": "grad", "norm": float(norm), "params": bad[:12],
                                     "n_bad": len(bad)})
            return norm
        torch.nn.utils.clip_grad_norm_ = clip_wrapped
        return self

    def remove(self):
        import qerl.rl.step as step_mod

        for h in self.handles:
            h.remove()
        for fn in ("grpo_loss", "dapo_loss"):
            setattr(step_mod, fn, self.saved[fn])
        torch.nn.utils.clip_grad_norm_ = self.saved["clip"]


def _quantized_for(method: str, root: str | None) -> str | None:
    from qerl.contract.methods import get_method

    fmt = get_method(method).weights
    if root is None or fmt == "bf16":
        return None
    path = Path(root) / fmt
    return str(path) if path.exists() else None


def trace_method(cfg: dict, task: str, method: str, base: str, quantized_root: str | None, steps: int,
                 check_finite: bool = False, gc: str | None = None, first_step: int = 0, profile: bool = True) -> dict:
    """Run `steps` training steps of (task, method, seed 0) from `first_step` and profile the last one (`profile`).

    Returns:
        {"method", "steps": [MetricsRow phase times, reward, skipped updates per step], "phases": phase_summary of
         the last step, "finite": the _FiniteWatch records (with check_finite), "build_s"}.
    """
    from qerl.data.prompts import build_prompt
    from qerl.rl.settings import build_run_policy, resolve_settings
    from qerl.rl.step import StepBatch, make_learner, rl_step
    from qerl.rl.trainer import batch_indices, load_task_problems

    s = resolve_settings(cfg, task, method, "default", seed=0)
    if gc is not None:
        s = replace(s, gradient_checkpointing=gc == "on")
    t0 = time.perf_counter()
    problems = load_task_problems(cfg, s)
    policy = build_run_policy(s, base, quantized=_quantized_for(method, quantized_root), dtype=cfg["model"]["dtype"],
                              device="cuda" if torch.cuda.is_available() else "cpu",
                              nf4_decode=cfg["model"]["nf4_decode"])
    learner = make_learner(policy, s)
    build_s = time.perf_counter() - t0
    watch = _FiniteWatch(policy.model).install() if check_finite else None
    levels = [p.level for p in problems]
    rows, phases = [], {}
    try:
        for step in range(first_step, first_step + steps):
            chosen = [problems[i] for i in batch_indices(levels, s.seed, step, s.prompts_per_step)]
            batch = StepBatch(step, [build_prompt(p.question, policy.tokenizer, s.instruction) for p in chosen],
                              [p.answer for p in chosen], 0, len(chosen) * s.group_size, [p.id for p in chosen])
            if watch:
                watch.step = step
            if profile and step == first_step + steps - 1:
                acts = [torch.profiler.ProfilerActivity.CPU]
                if torch.cuda.is_available():
                    torch.cuda.synchronize()
                    acts.append(torch.profiler.ProfilerActivity.CUDA)
                with torch.profiler.profile(activities=acts) as prof:
                    row = rl_step(learner, batch, s)
                phases = phase_summary(prof.events())
            else:
                row = rl_step(learner, batch, s)
            rows.append({"step": step, "rollout_s": round(row.time_rollout, 3), "logprobs_s": round(row.time_logprobs, 3),
                         "update_s": round(row.time_update, 3), "reward": round(row.reward, 4),
                         "length": round(row.response_length, 1), "skipped": row.skipped_updates,
                         "sigma": row.sigma, "peak_gb": round(row.peak_memory_bytes / 2**30, 2)})
            print(json.dumps({"method": method, **rows[-1]}), flush=True)
    finally:
        if watch:
            watch.remove()
    return {"method": method, "gc": s.gradient_checkpointing, "dtype": cfg["model"]["dtype"], "build_s": round(build_s, 1),
            "steps": rows, "phases": phases, "finite": watch.records if watch else None}


def markdown(results: list[dict]) -> str:
    """One table row per (method, phase): wall, kernels, kernel time, busy fraction, top kernel."""
    lines = ["| method | gc | phase | wall ms | kernels | kernel ms | busy | mean kernel us | top kernel (count, ms) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        for ph, v in r["phases"].items():
            top = v["top"][0] if v["top"] else ("-", 0, 0)
            lines.append(f"| {r['method']} | {'on' if r['gc'] else 'off'} | {ph} | {v['wall_ms']} | {v['kernels']} | "
                         f"{v['kernel_ms']} | {v['busy_fraction']:.0%} | {v['mean_kernel_us']} | "
                         f"{top[0][:50]} ({top[1]}, {top[2]}) |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    from qerl.config import load_config

    p = argparse.ArgumentParser(prog="python -m qerl.profiling.train_trace", description=__doc__.split("\n\n")[0])
    p.add_argument("--config", required=True)
    p.add_argument("--task", required=True)
    add_list(p, "--methods", required=True)
    p.add_argument("--base", required=True, help="base model folder (the DAG's models/<model>/base)")
    p.add_argument("--quantized-root", default=None, help="folder of the quantized checkpoints (<root>/<format>); "
                                                          "without it 4-bit methods quantize on load (round to nearest)")
    p.add_argument("--steps", type=int, default=3, help="steps per method; the last one is profiled")
    p.add_argument("--first-step", type=int, default=0)
    p.add_argument("--gc", choices=["on", "off"], default=None, help="override train.gradient_checkpointing")
    p.add_argument("--check-finite", action="store_true")
    p.add_argument("--no-profile", action="store_true", help="time the steps only (no torch profiler)")
    p.add_argument("--tf32", choices=["on", "off"], default=None, help="float32 matmuls on the tensor cores (TF32)")
    p.add_argument("--out", default=None)
    p.add_argument("--md", default=None)
    args = p.parse_args(argv)
    cfg = load_config(args.config)
    if args.tf32 is not None:
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = args.tf32 == "on"
    results = []
    for m in args.methods:
        results.append(trace_method(cfg, args.task, m, args.base, args.quantized_root, args.steps, args.check_finite,
                                    args.gc, args.first_step, not args.no_profile))
        results[-1]["tf32"] = torch.backends.cuda.matmul.allow_tf32
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        if args.out:
            Path(args.out).write_text(json.dumps(results, indent=1) + "\n")
    md = markdown(results)
    print(md)
    if args.md:
        Path(args.md).write_text(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
