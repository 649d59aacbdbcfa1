"""The quantization stage's two steps: AWQ scale search (`search_scales`, `qerl calibrate`) and the quantized
checkpoint with its layer-output errors (`write_quantized`, `qerl quantize`); the commands are
qerl/commands/calibrate.py and qerl/commands/quantize.py.

Run: `qerl calibrate --config config/config.yaml --base results/tiny/models/tiny/base --format nvfp4
      --out results/tiny/quantized/tiny/awq_scales/nvfp4.safetensors [--calib FILE]`
     `qerl quantize --config config/config.yaml --base results/tiny/models/tiny/base --format nvfp4
      --out results/tiny/quantized/tiny/nvfp4 [--scales results/tiny/quantized/tiny/awq_scales/nvfp4.safetensors]`
The calibration sequences come from config quantize.calibration (source, n_sequences, seq_len, seed); --calib
overrides the file that `source` names; --device cuda runs either step on a GPU (the calibrate log's last line gives
its seconds and peak memory). `qerl quantize --scales` folds the search's result into the model.

What the quantized folder holds:
- nvfp4 / mxfp4: the compressed-tensors checkpoint (config.json with quantization_config, model.safetensors,
  tokenizer files), AWQ-calibrated when scales are given (config quantize.awq), round-to-nearest otherwise;
- nf4: nf4_recipe.json (bitsandbytes re-quantizes the base at load time, deterministically);
- layer_errors.json: relative output error of every quantized linear on held-out sequences (quantize.heldout_sequences,
  drawn from the calibration source, disjoint from the calibration sequences): RTN always, AWQ when scaled; and the
  job's seconds and peak memory (qerl.memory.peak_memory_bytes: GPU with --device cuda, host RSS on a CPU).
Both outputs appear atomically.
"""
from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

from qerl.io import atomic_dir, atomic_file

__all__ = ["search_scales", "write_quantized"]


def search_scales(cfg: dict, base: str | Path, fmt: str, out: str | Path, calib: str | None = None,
                  device: str = "cpu") -> dict:
    """Search AWQ scales of the base model for `fmt` (nvfp4 or mxfp4) and write them to `out` (safetensors, the
    alphas in the metadata).

    Args:
        cfg: the validated config (quantize.calibration, quantize.awq_grid, prompt).
        base: the base checkpoint folder.
        fmt: the format the search targets.
        out: the scales file to write.
        calib: a JSONL of problems to calibrate on instead of the file quantize.calibration.source names.
        device: the torch device of the search (a 7B needs cuda).

    Returns:
        A summary: format, number of scale groups, seconds, device, peak memory, the chosen alphas.
    """
    import torch

    from qerl.memory import peak_memory_bytes
    from qerl.policy import build_policy
    from qerl.quantize.awq import calibrate, save_scales
    from qerl.quantize.calibration import calibration_tokens

    torch.manual_seed(cfg["quantize"]["calibration"]["seed"])
    policy = build_policy("bf16", base, dtype=torch.float32, device=device)
    model, tokenizer = policy.model, policy.tokenizer
    tokens, _ = calibration_tokens(cfg, tokenizer, calib)
    t = time.time()
    result = calibrate(model, tokens.to(device), fmt, cfg["quantize"]["awq_grid"], apply=False)
    with atomic_file(out) as tmp:
        save_scales(result, tmp)
    return {"format": fmt, "groups": len(result.scales), "seconds": round(time.time() - t, 2), "device": device,
            "peak_memory_bytes": peak_memory_bytes(), "alphas": result.alphas}


def _summary(errors: dict[str, float]) -> dict:
    return {"mean": statistics.mean(errors.values()), "max": max(errors.values()), "per_layer": errors}


def write_quantized(cfg: dict, base: str | Path, fmt: str, out: str | Path, scales_file: str | None = None,
                    calib: str | None = None, device: str = "cpu") -> dict:
    """Write the quantized checkpoint of one format (or the NF4 recipe) and layer_errors.json to the folder `out`.

    Args:
        cfg: the validated config (quantize, model.dtype, prompt).
        base: the base checkpoint folder.
        fmt: nvfp4, mxfp4 or nf4 (one of quantize.formats).
        out: the folder to write (atomically).
        scales_file: AWQ scales of `search_scales` (nvfp4/mxfp4), folded in before quantizing.
        calib: a JSONL of problems the held-out sequences come from instead of the file quantize.calibration.source
            names.
        device: the torch device of the layer errors and the quantization.

    Returns:
        What layer_errors.json holds.

    Raises:
        ValueError: a format not in quantize.formats; scales for nf4, or searched for another format.
    """
    import torch

    from qerl.memory import peak_memory_bytes
    from qerl.policy import build_policy, quantize_model
    from qerl.policy.checkpoint import save_nf4_recipe, save_quantized
    from qerl.quantize.awq import apply_awq, layer_errors, load_scales
    from qerl.quantize.calibration import calibration_tokens

    qcfg = cfg["quantize"]
    if fmt not in qcfg["formats"]:
        raise ValueError(f"--format {fmt!r} is not in config quantize.formats {qcfg['formats']}")
    if scales_file and fmt == "nf4":
        raise ValueError("--scales: AWQ scales apply to nvfp4/mxfp4, not nf4")
    scales = None
    if scales_file:
        result = load_scales(scales_file)
        if result.fmt != fmt:
            raise ValueError(f"--scales {scales_file!r} were searched for {result.fmt}, not {fmt}")
        scales = {k: v.to(device) for k, v in result.scales.items()}
    t0 = time.time()
    policy = build_policy("bf16", base, dtype=torch.float32, device=device)
    model, tokenizer = policy.model, policy.tokenizer
    _, held = calibration_tokens(cfg, tokenizer, calib, heldout=qcfg["heldout_sequences"])
    held = held.to(device)
    report = {"format": fmt, "method": "awq" if scales else "rtn", "base": base,
              "heldout_sequences": qcfg["heldout_sequences"], "seq_len": qcfg["calibration"]["seq_len"],
              "rtn": _summary(layer_errors(model, held, fmt))}
    if scales:
        report["awq"] = _summary(layer_errors(model, held, fmt, scales))

    with atomic_dir(Path(out)) as tmp:
        if fmt == "nf4":
            save_nf4_recipe(base, tmp, compute_dtype=cfg["model"]["dtype"])
        else:
            if scales:
                apply_awq(model, scales)
            dtype = getattr(torch, cfg["model"]["dtype"])
            quantize_model(model.to(dtype), fmt, tuple(qcfg["targets"]))
            save_quantized(model, tmp / "ckpt", tokenizer)
            for f in (tmp / "ckpt").iterdir():
                f.rename(tmp / f.name)
            (tmp / "ckpt").rmdir()
        report["seconds"] = round(time.time() - t0, 2)
        report["peak_memory_bytes"] = peak_memory_bytes()
        (tmp / "layer_errors.json").write_text(json.dumps(report, indent=1))
    return report
