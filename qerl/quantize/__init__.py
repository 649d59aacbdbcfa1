"""Quantizing a base model: AWQ-style calibration (awq, calibration), compressed-tensors checkpoints (checkpoint),
the `qerl calibrate` / `qerl quantize` subcommands (calibrate_cmd, quantize_cmd), their DAG inputs (dag) and the
AWQ-vs-RTN measurement (measure: `python -m qerl.quantize.measure`).

The conversion itself (`quantize_`, QuantLinear) lives in qerl.layers; the formats in qerl.formats.
"""
from qerl.quantize.awq import AWQResult, apply_awq, calibrate, fake_quantize, layer_errors, load_scales, save_scales
from qerl.quantize.calibration import calibration_file, layerwise_inputs, read_texts, token_chunks
from qerl.quantize.checkpoint import load_quantized, save_nf4_recipe, save_quantized

__all__ = [
    "AWQResult",
    "apply_awq",
    "calibrate",
    "calibration_file",
    "fake_quantize",
    "layer_errors",
    "layerwise_inputs",
    "load_quantized",
    "load_scales",
    "read_texts",
    "save_nf4_recipe",
    "save_quantized",
    "save_scales",
    "token_chunks",
]
