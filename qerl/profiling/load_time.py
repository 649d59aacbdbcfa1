"""How long loading a quantized checkpoint takes, and where: `python -m qerl.profiling.load_time --arch 7B`.

Why: in paper-scale run 4 (4 x H200) every NVFP4 / MXFP4 job spent ~230-250 s before its first step (training
set-up 237-251 s against BF16 LoRA's 12 s; evaluation 281-287 s of which sampling was 28 s), and on the CPU the cause
was `load_quantized` building the model with random initialization of every linear the checkpoint then replaces.
This writes a random-weight checkpoint of a Qwen2.5 size in the given 4-bit format (weights drawn and quantized on
the GPU, round-to-nearest: the file's layout is what matters here, not its values), then times `load_quantized`
onto the device in a fresh process (what the trainer's and evaluator's `build_policy` calls, the tokenizer and
LoRA wrapping aside) with one forward, and prints one JSON object (seconds, host max RSS, peak GPU memory).

Run on a GPU machine (CPU also works for small sizes: `--arch 0.5B --layers 2 --device cpu`).
"""
from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

__all__ = ["write_checkpoint", "time_load", "main"]


def write_checkpoint(arch: str, fmt: str, out: Path, device: str, layers: int | None = None) -> dict:
    """A random Qwen2.5-`arch` checkpoint in `fmt` at `out` (drawn in `fmt` on `device`, saved by save_quantized)."""
    import torch

    from qerl.policy.checkpoint import save_quantized
    from qerl.profiling.build import random_base

    start = time.perf_counter()
    model = random_base(arch, fmt, layers=layers, device=device, dtype=torch.bfloat16, seed=0)
    save_quantized(model, out)
    return {"write_seconds": round(time.perf_counter() - start, 1),
            "file_gb": round(sum(f.stat().st_size for f in out.glob("*.safetensors")) / 1e9, 2)}


def time_load(folder: Path, device: str) -> dict:
    """Load `folder` onto `device` with load_quantized and run one forward: seconds, host max RSS, peak device
    memory."""
    import torch

    from qerl.memory import peak_memory_bytes
    from qerl.policy.checkpoint import load_quantized

    start = time.perf_counter()
    model = load_quantized(folder, torch.bfloat16, device)
    loaded = time.perf_counter() - start
    ids = torch.arange(8, device=device).unsqueeze(0)
    with torch.no_grad():
        logits = model(ids).logits
    if device != "cpu":
        torch.cuda.synchronize()
    return {"seconds": round(loaded, 2), "forward_finite": bool(torch.isfinite(logits).all()),
            "host_max_rss_gib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2),
            "peak_memory_gb": round((peak_memory_bytes() or 0) / 1e9, 2)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m qerl.profiling.load_time", description=__doc__.split("\n")[0])
    parser.add_argument("--arch", default="7B", help="a Qwen2.5 size of qerl.profiling.archs (default 7B)")
    parser.add_argument("--layers", type=int, default=None, help="decoder layers (default: the architecture's)")
    parser.add_argument("--format", default="nvfp4", choices=["nvfp4", "mxfp4"])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--folder", type=Path, default=None, help="the folder to write the checkpoint under, in a "
                        "temporary folder removed at the end (default: the system's temporary folder)")
    parser.add_argument("--child", type=Path, default=None, help=argparse.SUPPRESS)  # the load, in its own process
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(time_load(args.child, args.device)))
        return 0
    with tempfile.TemporaryDirectory(dir=args.folder) as tmp:
        folder = Path(tmp) / "quantized"
        report = {"arch": args.arch, "layers": args.layers, "format": args.format, "device": args.device}
        report |= write_checkpoint(args.arch, args.format, folder, args.device, args.layers)
        done = subprocess.run([sys.executable, "-m", "qerl.profiling.load_time", "--child", str(folder),
                               "--device", args.device], capture_output=True, text=True)
        if done.returncode:
            sys.stderr.write(done.stderr[-3000:])
            raise SystemExit(f"load_time: the load failed (exit {done.returncode})")
        report["load"] = json.loads(done.stdout.strip().splitlines()[-1])
        print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
