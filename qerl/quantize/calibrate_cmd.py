"""`qerl calibrate`: search AWQ scales for one 4-bit format and write them (safetensors, alphas in the metadata).

Run: `qerl calibrate --config config/config.yaml --base results/tiny/models/tiny/base --format nvfp4
      --out results/tiny/quantized/tiny/awq_scales/nvfp4.safetensors [--calib FILE]`
The calibration sequences come from config quantize.calibration (source, n_sequences, seq_len, seed); --calib
overrides the file that `source` names; --device cuda runs the search on a GPU (the log's last line gives its
seconds and peak memory). `qerl quantize --scales` folds the result into the model.
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from qerl.io import atomic_file

__all__ = ["add_arguments", "run", "calibration_tokens"]

RENAMED = {"--model-dir": "--base", "--data": "--calib"}  # old spellings still work (qerl.cli.parse_args)


def add_arguments(parser) -> None:
    parser.add_argument("--config", required=True, help="YAML config file (validated against the schema)")
    parser.add_argument("--base", required=True, metavar="DIR",
                        help="base checkpoint folder (config.json, weights, tokenizer)")
    parser.add_argument("--format", required=True, choices=["nvfp4", "mxfp4"], help="format the search targets")
    parser.add_argument("--out", required=True, help="scales file to write (.safetensors)")
    parser.add_argument("--calib", default=None, metavar="FILE",
                        help="JSONL of problems to calibrate on (default: the file quantize.calibration.source names)")
    parser.add_argument("--no-data-check", action="store_true", help="do not require benchmark files to exist")
    parser.add_argument("--device", default="cpu", help="torch device of the search (default cpu; a 7B needs cuda)")


def calibration_tokens(cfg: dict, tokenizer, data: str | None, heldout: int = 0):
    """(calibration [n, L], held-out [heldout, L] or None) token chunks per config quantize.calibration.

    Raises:
        ValueError: missing data file, or too little text for the requested chunks.
    """
    from qerl.quantize.calibration import calibration_file, read_texts, token_chunks

    cal = cfg["quantize"]["calibration"]
    path = data or calibration_file(cfg)
    if not Path(path).is_file():
        raise ValueError(f"calibration data file {path!r} does not exist (config quantize.calibration.source = "
                         f"{cal['source']!r})")
    # the policy's own view of the data (chat template + <think>/<answer> completion) when the tokenizer has a template
    instruction = cfg["prompt"]["instruction"] if getattr(tokenizer, "chat_template", None) else None
    texts = read_texts(path, tokenizer=tokenizer, instruction=instruction)
    calib = token_chunks(texts, tokenizer, cal["n_sequences"], cal["seq_len"], cal["seed"])
    held = None
    if heldout:
        held = token_chunks(texts, tokenizer, heldout, cal["seq_len"], cal["seed"], exclude=cal["n_sequences"])
    return calib, held


def run(args) -> int:
    import torch

    from qerl.config import load_config
    from qerl.memory import peak_memory_bytes
    from qerl.quantize.awq import calibrate, save_scales
    from qerl.policy import build_policy

    cfg = load_config(args.config, check_data=not args.no_data_check)
    torch.manual_seed(cfg["quantize"]["calibration"]["seed"])
    policy = build_policy("bf16", args.base, dtype=torch.float32, device=args.device)
    model, tokenizer = policy.model, policy.tokenizer
    calib, _ = calibration_tokens(cfg, tokenizer, args.calib)
    t = time.time()
    result = calibrate(model, calib.to(args.device), args.format, cfg["quantize"]["awq_grid"], apply=False)
    with atomic_file(args.out) as tmp:
        save_scales(result, tmp)
    print(json.dumps({"format": args.format, "groups": len(result.scales), "seconds": round(time.time() - t, 2),
                      "device": args.device, "peak_memory_bytes": peak_memory_bytes(), "alphas": result.alphas}),
          file=sys.stderr)
    return 0
