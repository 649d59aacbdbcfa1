"""Input functions of workflow/rules/quantize.smk (kept in Python so the rule file only wires; `snakemake --lint`).

Paths (R = <results_dir>/<scale>; qerl/contract/paths.py):
    R/quantized/<model>/awq_scales/<fmt>.safetensors   `calibrate` (nvfp4, mxfp4; when quantize.awq)
    R/quantized/<model>/<fmt>/                         `quantize`: checkpoint or NF4 recipe + layer_errors.json
"""
from __future__ import annotations

from qerl.contract import paths

__all__ = ["calibration_file", "calibration_inputs", "quantize_inputs", "quantized_dirs", "scales_path"]


def calibration_file(cfg: dict) -> str:
    """The JSONL file config key quantize.calibration.source names (for the rules and the CLI).

    "train" is the scale's own training problems: the tiny scale's generated RL split
    (R/data/tiny/rl.jsonl, qerl.contract.paths), else GSM8K's or MATH's train split under data.root, whichever of
    gsm8k / math_train the config's data.benchmarks lists first. A benchmark name picks its train split directly.

    Raises:
        ValueError: naming the key and the value when no train split fits.
    """
    from qerl.contract.paths import BENCHMARK_FILES, root_of, tiny_split

    source = cfg["quantize"]["calibration"]["source"]
    root = cfg["data"]["root"]
    if source == "train":
        if cfg["model"]["source"] == "tiny":
            return tiny_split(root_of(cfg), "rl")
        for name in ("gsm8k", "math_train"):
            if name in cfg["data"]["benchmarks"]:
                return f"{root}/{BENCHMARK_FILES[name]['train']}"
        raise ValueError("key 'quantize.calibration.source' = 'train': data.benchmarks lists neither gsm8k nor "
                         f"math_train (it lists {cfg['data']['benchmarks']}); name a benchmark with a train split")
    if "train" not in BENCHMARK_FILES.get(source, {}):
        known = sorted(n for n, splits in BENCHMARK_FILES.items() if "train" in splits)
        raise ValueError(f"key 'quantize.calibration.source' = {source!r}: not 'train' nor a benchmark with a train "
                         f"split ({known})")
    return f"{root}/{BENCHMARK_FILES[source]['train']}"


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
