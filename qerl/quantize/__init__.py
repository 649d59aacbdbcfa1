"""Quantizing a base model (the calibration stage of the format stack): AWQ-style scale search (awq, calibration),
the stage's two DAG steps (stage: `search_scales` for `qerl calibrate`, `write_quantized` for `qerl quantize`; their
commands are in qerl/commands), their DAG inputs (dag) and the AWQ-vs-RTN measurement (measure, a developer tool:
`python -m qerl.quantize.measure`).

The stage reads and converts models through the policy core (qerl.policy: `build_policy`, `quantize_model`), and
writes its checkpoints with qerl.policy.checkpoint (the compressed-tensors layout, and the NF4 recipe), which the
trainer and the evaluator load; the conversion itself (`quantize_`, QuantLinear) lives in qerl.layers, the formats
in qerl.formats.

Imports are lazy (PEP 562 `__getattr__`): the Snakefile imports `qerl.quantize.dag` (torch-free input functions)
every time Snakemake parses the workflow, and eager imports of awq / calibration here pulled torch into every
`snakemake` call (1.1 of the 3.3 s of a dry run on a 2-core Xeon).
"""
from __future__ import annotations

import importlib

_HOME = {
    **dict.fromkeys(("AWQResult", "apply_awq", "calibrate", "fake_quantize", "layer_errors", "load_scales",
                     "save_scales"), "awq"),
    **dict.fromkeys(("layerwise_inputs", "read_texts", "token_chunks"), "calibration"),
    "calibration_file": "dag",
}


def __getattr__(name: str):
    if name in _HOME:
        return getattr(importlib.import_module(f"qerl.quantize.{_HOME[name]}"), name)
    raise AttributeError(f"module 'qerl.quantize' has no attribute {name!r}")


__all__ = [
    "AWQResult",
    "apply_awq",
    "calibrate",
    "calibration_file",
    "fake_quantize",
    "layer_errors",
    "layerwise_inputs",
    "load_scales",
    "read_texts",
    "save_scales",
    "token_chunks",
]
