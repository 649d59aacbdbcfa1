"""Input functions of workflow/rules/quantize.smk (kept in Python so the rule file only wires; `snakemake --lint`).

Paths (R = <results_dir>/<scale>; qerl/contract/paths.py):
    R/quantized/<model>/awq_scales/<fmt>.safetensors   `calibrate` (nvfp4, mxfp4; when quantize.awq)
    R/quantized/<model>/<fmt>/                         `quantize`: checkpoint or NF4 recipe + layer_errors.json
"""
from __future__ import annotations

from qerl.contract import paths
from qerl.quantize.calibration import calibration_file

__all__ = ["calibration_inputs", "quantize_inputs", "quantized_dirs", "scales_path"]


def calibration_inputs(config: dict, results: str) -> dict:
    """The calibration JSONL as an input when a rule makes it (tiny scale: gen_tiny), else the data manifest."""
    if config["model"]["source"] == "tiny" and config["quantize"]["calibration"]["source"] == "train":
        return {"data": calibration_file(config)}
    return {"manifest": paths.data_manifest(results)}


def scales_path(results: str, model: str, fmt: str) -> str:
    """Where `calibrate` writes the AWQ scales of one model and format."""
    return paths.awq_scales_file(results, model, fmt)


def quantize_inputs(config: dict, results: str, configfile, model: str, fmt: str) -> dict:
    """Inputs of `quantize` for one model and format: config, base checkpoint, data, and AWQ scales when used."""
    inputs = {"config": configfile, "base": paths.base_model_dir(results, model), **calibration_inputs(config, results)}
    if config["quantize"]["awq"] and fmt in ("nvfp4", "mxfp4"):
        inputs["scales"] = scales_path(results, model, fmt)
    return inputs


def quantized_dirs(config: dict, results: str, model: str) -> list[str]:
    """Every quantized checkpoint folder of this config (for rule all and the evaluation rules)."""
    return [paths.quantized_dir(results, model, fmt) for fmt in config["quantize"]["formats"]]
