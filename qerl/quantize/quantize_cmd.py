"""`qerl quantize`: write the quantized checkpoint of one format and a JSON of its layer-output errors.

Run: `qerl quantize --config config/config.yaml --base results/tiny/models/tiny/base --format nvfp4
      --out results/tiny/quantized/tiny/nvfp4 [--scales results/tiny/quantized/tiny/awq_scales/nvfp4.safetensors]`

What OUT holds:
- nvfp4 / mxfp4: the compressed-tensors checkpoint (config.json with quantization_config, model.safetensors,
  tokenizer files), AWQ-calibrated when --scales is given (config quantize.awq), round-to-nearest otherwise;
- nf4: nf4_recipe.json (bitsandbytes re-quantizes the base at load time, deterministically);
- layer_errors.json: relative output error of every quantized linear on held-out sequences (quantize.heldout_sequences,
  drawn from the calibration source, disjoint from the calibration sequences): RTN always, AWQ when scaled; and the
  job's seconds and peak memory (qerl.memory.peak_memory_bytes: GPU with --device cuda, host RSS on a CPU).
OUT appears atomically.
"""
from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

from qerl.io import atomic_dir

__all__ = ["add_arguments", "run"]

RENAMED = {"--model-dir": "--base", "--data": "--calib"}  # old spellings still work (qerl.cli.parse_args)


def add_arguments(parser) -> None:
    parser.add_argument("--config", required=True, help="YAML config file (validated against the schema)")
    parser.add_argument("--base", required=True, metavar="DIR",
                        help="base checkpoint folder (config.json, weights, tokenizer)")
    parser.add_argument("--format", required=True, choices=["nvfp4", "mxfp4", "nf4"])
    parser.add_argument("--out", required=True, help="output folder")
    parser.add_argument("--scales", default=None, help="AWQ scales from `qerl calibrate` (nvfp4/mxfp4)")
    parser.add_argument("--calib", default=None, metavar="FILE",
                        help="JSONL of problems the held-out sequences of layer_errors.json come from (default: the "
                             "file quantize.calibration.source names, as for `qerl calibrate`)")
    parser.add_argument("--no-data-check", action="store_true", help="do not require benchmark files to exist")
    parser.add_argument("--device", default="cpu", help="torch device of the search (default cpu; a 7B needs cuda)")


def _summary(errors: dict[str, float]) -> dict:
    return {"mean": statistics.mean(errors.values()), "max": max(errors.values()), "per_layer": errors}


def run(args) -> int:
    import torch

    from qerl.config import load_config
    from qerl.memory import peak_memory_bytes
    from qerl.policy import build_policy, quantize_model
    from qerl.policy.checkpoint import save_nf4_recipe, save_quantized
    from qerl.quantize.awq import apply_awq, layer_errors, load_scales
    from qerl.quantize.calibrate_cmd import calibration_tokens

    cfg = load_config(args.config, check_data=not args.no_data_check)
    qcfg = cfg["quantize"]
    if args.format not in qcfg["formats"]:
        raise ValueError(f"--format {args.format!r} is not in config quantize.formats {qcfg['formats']}")
    if args.scales and args.format == "nf4":
        raise ValueError("--scales: AWQ scales apply to nvfp4/mxfp4, not nf4")
    scales = None
    if args.scales:
        result = load_scales(args.scales)
        if result.fmt != args.format:
            raise ValueError(f"--scales {args.scales!r} were searched for {result.fmt}, not {args.format}")
        scales = {k: v.to(args.device) for k, v in result.scales.items()}
    t0 = time.time()
    policy = build_policy("bf16", args.base, dtype=torch.float32, device=args.device)
    model, tokenizer = policy.model, policy.tokenizer
    _, held = calibration_tokens(cfg, tokenizer, args.calib, heldout=qcfg["heldout_sequences"])
    held = held.to(args.device)
    report = {"format": args.format, "method": "awq" if scales else "rtn", "base": args.base,
              "heldout_sequences": qcfg["heldout_sequences"], "seq_len": qcfg["calibration"]["seq_len"],
              "rtn": _summary(layer_errors(model, held, args.format))}
    if scales:
        report["awq"] = _summary(layer_errors(model, held, args.format, scales))

    out = Path(args.out)
    with atomic_dir(out) as tmp:
        if args.format == "nf4":
            save_nf4_recipe(args.base, tmp, compute_dtype=cfg["model"]["dtype"])
        else:
            if scales:
                apply_awq(model, scales)
            dtype = getattr(torch, cfg["model"]["dtype"])
            quantize_model(model.to(dtype), args.format, tuple(qcfg["targets"]))
            save_quantized(model, tmp / "ckpt", tokenizer)
            for f in (tmp / "ckpt").iterdir():
                f.rename(tmp / f.name)
            (tmp / "ckpt").rmdir()
        report["seconds"] = round(time.time() - t0, 2)
        report["peak_memory_bytes"] = peak_memory_bytes()
        (tmp / "layer_errors.json").write_text(json.dumps(report, indent=1))
    line = {k: round(v["mean"], 5) for k, v in report.items() if isinstance(v, dict)}
    print(json.dumps({"format": args.format, "method": report["method"], "mean_layer_error": line}), file=sys.stderr)
    return 0
