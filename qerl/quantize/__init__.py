"""Quantizing a base model (the calibration stage of the format stack): AWQ-style scale search (awq, calibration),
the stage's two DAG steps (stage: `search_scales` for `qerl calibrate`, `write_quantized` for `qerl quantize`; their
commands are in qerl/commands), their DAG inputs (dag) and the AWQ-vs-RTN measurement (measure, a developer tool:
`python -m qerl.quantize.measure`).

The stage reads and converts models through the policy core (qerl.policy: `build_policy`, `quantize_model`), and
writes its checkpoints with qerl.policy.checkpoint (the compressed-tensors layout, and the NF4 recipe), which the
trainer and the evaluator load; the conversion itself (`quantize_`, QuantLinear) lives in qerl.layers, the formats
in qerl.formats.
"""
from qerl.quantize.awq import AWQResult, apply_awq, calibrate, fake_quantize, layer_errors, load_scales, save_scales
from qerl.quantize.calibration import calibration_file, layerwise_inputs, read_texts, token_chunks

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
