"""How the rollout throughput of jobs sharing one GPU scales with their number (the small scale's budget question).

The small DAG runs 6-8 jobs of a 135M model on one GPU at once (resources.train.jobs_per_gpu, under CUDA's
multi-process service). On the H100 a GRPO step took 3.2-4.3 s for one job alone and 9-13.5 s with 8 jobs, the GPU
"100 % busy": is the GPU's arithmetic or memory saturated, or is it the stream of small kernels from many processes?
This measures the rollout part alone, on random weights of SmolLM2-135M-Instruct's shape (speed does not depend on
the values): K worker processes each build the model with LoRA adapters (as a training job's policy), a decode
engine of `batch` rows with its CUDA graphs, wait until every worker is ready, then all generate `reps` times
`steps` tokens (every row to the end, as a rollout batch with one looping row does). Per K it reports each worker's
decode steps/s and the sum over workers of rows x steps / s, with how many kernels one decode step launches (torch
profiler over eager steps, measured once), so the aggregate kernel rate can be read against the per-process one.

    python -m qerl.profiling.share_gpu --procs 1 2 4 8 --out results/share_gpu.json     (one GPU; under MPS:
    bash workflow/with_mps.sh python -m qerl.profiling.share_gpu ...)

Runs on a CPU too (no graphs; `--layers 2 --hidden 64` for a smoke test): tests/profiling/test_share_gpu.py.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

__all__ = ["smollm2_config", "worker", "main"]


def smollm2_config(layers: int = 30, hidden: int = 576):
    """SmolLM2-135M-Instruct's architecture (LlamaConfig), optionally cut down for tests."""
    from transformers import LlamaConfig

    heads = max(1, hidden // 64)
    return LlamaConfig(vocab_size=49152, hidden_size=hidden, intermediate_size=hidden * 8 // 3,
                       num_hidden_layers=layers,
                       num_attention_heads=heads, num_key_value_heads=max(1, heads // 3), max_position_embeddings=8192,
                       tie_word_embeddings=True, rms_norm_eps=1e-5, rope_theta=100000.0)


def _build(args, device):
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    with torch.device(device):
        model = LlamaForCausalLM(smollm2_config(args.layers, args.hidden)).to(dtype)
    if args.rank:
        targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
        model = get_peft_model(model, LoraConfig(r=args.rank, lora_alpha=2 * args.rank, target_modules=targets))
    return model.eval()


def _kernels_per_step(eng, span: int) -> int | None:
    """CUDA kernels one eager decode step launches (the graph replays the same ones)."""
    if eng.device.type != "cuda":
        return None
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        eng.decode_steps(span, 4)
        torch.cuda.synchronize()
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    return round(len(kernels) / 4)


def worker(args) -> dict:
    """One process: build, capture, signal ready, wait for `go`, time the generations."""
    from qerl.rl.engine import DecodeEngine

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = _build(args, device)
    plen = args.prompt
    eng = DecodeEngine(model, args.batch, plen + args.steps, bucket=512)
    gen = torch.Generator(device=device).manual_seed(1)
    ids = torch.randint(0, model.config.vocab_size, (args.batch, plen), device=device, generator=gen)
    attn = torch.ones_like(ids)
    eng.generate(ids, attn, max_new_tokens=args.steps, force_length=True)  # captures every graph, warms up
    kernels = _kernels_per_step(eng, max(eng.spans(plen, args.steps))) if args.count_kernels else None
    Path(args.ready).touch()
    while not Path(args.go).exists():
        time.sleep(0.001)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    sync()
    t0 = time.perf_counter()
    for _ in range(args.reps):
        eng.generate(ids, attn, max_new_tokens=args.steps, force_length=True)
    sync()
    seconds = time.perf_counter() - t0
    return {"seconds": seconds, "steps_per_s": args.reps * args.steps / seconds, "kernels_per_step": kernels}


def _run_k(args, k: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        go = Path(tmp) / "go"
        procs = []
        for i in range(k):
            cmd = [sys.executable, "-m", "qerl.profiling.share_gpu", "--worker", "--ready", f"{tmp}/ready{i}",
                   "--go", str(go), "--batch", str(args.batch), "--steps", str(args.steps),
                   "--prompt", str(args.prompt),
                   "--reps", str(args.reps), "--rank", str(args.rank), "--layers", str(args.layers),
                   "--hidden", str(args.hidden)] + (["--count-kernels"] if i == 0 and k == 1 else [])
            procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True))
        while not all(Path(f"{tmp}/ready{i}").exists() for i in range(k)):
            if any(p.poll() not in (None, 0) for p in procs):
                raise RuntimeError(f"a share_gpu worker failed (K = {k}); its traceback is above")
            time.sleep(0.05)
        go.touch()
        rows = [json.loads(p.communicate()[0].strip().splitlines()[-1]) for p in procs]
        if any(p.returncode for p in procs):
            raise RuntimeError(f"a share_gpu worker failed (K = {k})")
    per = [r["steps_per_s"] for r in rows]
    return {"procs": k, "batch": args.batch, "steps_per_s_each": [round(x, 1) for x in per],
            "rows_steps_per_s": round(args.batch * sum(per)), "kernels_per_step": rows[0]["kernels_per_step"]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--procs", type=int, nargs="+", default=[1, 2, 4, 8])
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--steps", type=int, default=256, help="tokens generated per row (every row to the end)")
    ap.add_argument("--prompt", type=int, default=192)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--rank", type=int, default=32, help="LoRA rank of the policy (0: none)")
    ap.add_argument("--layers", type=int, default=30)
    ap.add_argument("--hidden", type=int, default=576)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--ready", help=argparse.SUPPRESS)
    ap.add_argument("--go", help=argparse.SUPPRESS)
    ap.add_argument("--count-kernels", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(args)), flush=True)
        return 0
    if args.out is None:
        ap.error("--out is required")
    results, kernels, base = [], None, None
    for k in args.procs:
        row = _run_k(args, k)
        kernels = row["kernels_per_step"] = row["kernels_per_step"] or kernels  # counted in the one-process run
        if k == 1:
            base = row["rows_steps_per_s"]
        row["speedup_vs_one"] = round(row["rows_steps_per_s"] / base, 2) if base else None
        if kernels:
            row["kernels_per_s"] = round(kernels * sum(row["steps_per_s_each"]))
        results.append(row)
        print(json.dumps(row), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    env = {"gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu", "torch": torch.__version__,
           "mps": "CUDA_MPS_PIPE_DIRECTORY" in os.environ}  # set by workflow/with_mps.sh when its daemon started
    tmp = args.out.with_suffix(".tmp")
    tmp.write_text(json.dumps({"environment": env, "settings": vars(args) | {"out": str(args.out)},
                               "results": results}, indent=1, default=str))
    tmp.replace(args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
