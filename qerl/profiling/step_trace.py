"""Where the microseconds of one decode step go: kernels per step and per layer, time per kernel, graph step time.

Why: the rollout engine's speed at small batch is set by how many kernels a decode step launches and how long each
runs, not by the GEMMs alone. This tool profiles one engine configuration with the torch profiler (CUPTI): it runs
a few eager decode steps (the same kernels a captured graph replays), counts the CUDA kernels per step, sums their
device time by kernel name, and times the captured graph's replay (the real step). "Gap" = graph step time minus
the summed kernel time: launch latency and idle time between kernels that the graph does not remove.

A second engine implementation can be loaded from a file (`--engine-file`, e.g. an earlier commit's
qerl/rl/engine.py extracted with `git show <commit>:qerl/rl/engine.py`), so a before/after comparison runs on the
same GPU in the same process. Only that one file is loaded: an engine.py from after the engine's projection groups
moved to qerl/rl/engine_groups.py imports `Group` from the checkout that runs it, not from its own commit.

Run (GPU): python -m qerl.profiling.step_trace --arch 7B --methods lora qerl --batches 1 64 --span 1024 \\
               --out trace.json [--engine-file old_engine.py --engine-name before]
Output: one JSON object per configuration (printed, and appended to --out as a list) and a Markdown table
(--md) of kernels per step and per layer, summed kernel time, graph step time, and the top kernels by time.
"""
from __future__ import annotations

import argparse
import functools
import json
import time
from collections import defaultdict
from pathlib import Path

import torch

from qerl.args import add_list

__all__ = ["trace_engine", "main"]


def _load_engine_class(path: str | None):
    if path is None:
        from qerl.rl.engine import DecodeEngine
        return DecodeEngine
    from qerl_kernels.bench import load_module_file

    return load_module_file(path, "qerl_engine_alt").DecodeEngine


@torch.no_grad()
def _old_steps(eng, span: int, n: int) -> None:
    """Eager decode steps of an engine without `decode_steps` (commit e617c11 and before)."""
    eng._enter_bucket(span, n + 2)
    for _ in range(n):
        eng._decode_step(span, 1.0, 1.0)


def trace_engine(engine_cls, model, batch: int, span: int, steps: int = 3, reps: int = 20) -> dict:
    """Profile decode steps of `engine_cls(model, batch, ...)` attending over `span` slots.

    Returns:
        dict with kernels_per_step, kernels_per_layer (kernels whose per-step count is a multiple of the layer
        count, divided by it), kernel_us_per_step, graph_step_us, gap_us and top kernels [(name, count per step,
        us per step)].
    """
    from torch.profiler import ProfilerActivity, profile

    layers = model.config.num_hidden_layers if hasattr(model, "config") else 1
    eng = engine_cls(model, batch, span + 8, bucket=span)
    eng.capture(span - 8, 8)  # the decode graph of bucket `span` (plus warm-up: autotuning, lazy inits)
    graph_s = eng.step_seconds(span, reps)
    run = getattr(eng, "decode_steps", None) or functools.partial(_old_steps, eng)
    run(span, 2)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        run(span, steps)
        torch.cuda.synchronize()
    count, dur = defaultdict(int), defaultdict(float)
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA:
            count[ev.name] += 1
            dur[ev.name] += ev.device_time_total if hasattr(ev, "device_time_total") else ev.cuda_time_total
    per_step = sum(count.values()) / steps
    per_layer = sum(c for c in count.values() if (c // steps) % layers == 0 and c // steps >= layers) / steps / layers
    kern_us = sum(dur.values()) / steps
    top = sorted(((n, count[n] / steps, dur[n] / steps) for n in count), key=lambda r: -r[2])[:15]
    del eng
    torch.cuda.empty_cache()
    return dict(batch=batch, span=span, layers=layers, kernels_per_step=per_step, kernels_per_layer=per_layer,
                kernel_us_per_step=kern_us, graph_step_us=graph_s * 1e6, gap_us=graph_s * 1e6 - kern_us,
                top=[(n[:90], round(c, 2), round(u, 1)) for n, c, u in top])


def _md(rows) -> str:
    out = ["| engine | method | batch | span | kernels/step | kernels/layer | kernel us/step | graph step us | "
           "gap us | tok/s (graph) |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r['engine']} | {r['method']} | {r['batch']} | {r['span']} | {r['kernels_per_step']:.0f} | "
                   f"{r['kernels_per_layer']:.1f} | {r['kernel_us_per_step']:.0f} | {r['graph_step_us']:.0f} | "
                   f"{r['gap_us']:.0f} | {r['batch'] / r['graph_step_us'] * 1e6:.0f} |")
    for r in rows:
        out += ["", f"Top kernels, {r['engine']} {r['method']} batch {r['batch']} (name, launches/step, us/step):", ""]
        out += [f"- {n}: {c:g} x, {u:.1f} us" for n, c, u in r["top"]]
    return "\n".join(out) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--arch", default="7B")
    add_list(ap, "--methods", default=["lora", "qerl"], metavar="METHOD")
    add_list(ap, "--batches", item_type=int, default=[1, 64], metavar="B")
    ap.add_argument("--rank", type=int, default=32)
    ap.add_argument("--span", type=int, default=1024, help="attention bucket of the profiled step")
    ap.add_argument("--layers", type=int, default=None, help="build only this many layers")
    ap.add_argument("--engine-file", default=None, help="profile this engine implementation as well")
    ap.add_argument("--engine-name", default="before")
    ap.add_argument("--out", default=None, help="JSON list of the results")
    ap.add_argument("--md", default=None, help="Markdown summary")
    args = ap.parse_args(argv)
    from qerl.profiling.build import build_random_model

    engines = [("after", _load_engine_class(None))]
    if args.engine_file:
        engines.append((args.engine_name, _load_engine_class(args.engine_file)))
    rows = []
    for method in args.methods:
        t0 = time.time()
        model = build_random_model(args.arch, method, rank=args.rank, layers=args.layers, device="cuda")
        print(f"# built {args.arch} {method} in {time.time() - t0:.0f} s", flush=True)
        for name, cls in engines:  # the new engine first: the old one re-homes the model's weights
            for b in args.batches:
                r = dict(engine=name, method=method, arch=args.arch, **trace_engine(cls, model, b, args.span))
                rows.append(r)
                print(json.dumps(r), flush=True)
        del model
        torch.cuda.empty_cache()
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=1))
    md = _md(rows)
    if args.md:
        Path(args.md).write_text(md)
    print(md, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
