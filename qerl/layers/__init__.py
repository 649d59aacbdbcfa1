"""Frozen 4-bit linear layers: QuantLinear, the `quantize_` conversion API, the w4a16 kernel entry point, peft LoRA.

`qerl.layers.lora` (peft registration) is imported lazily so that importing the layers does not import peft.
"""
from qerl.layers.ops import dequantize_weight, w4a16_linear, w4a16_linear_reference
from qerl.layers.quant_linear import (
    DEFAULT_TARGETS,
    MXFP4Config,
    NVFP4Config,
    QuantLinear,
    default_filter,
    expected_nbytes,
    model_nbytes,
    quantize_,
    share_kernel_storage,
)

__all__ = [
    "DEFAULT_TARGETS",
    "MXFP4Config",
    "NVFP4Config",
    "QuantLinear",
    "default_filter",
    "dequantize_weight",
    "expected_nbytes",
    "model_nbytes",
    "quantize_",
    "share_kernel_storage",
    "w4a16_linear",
    "w4a16_linear_reference",
]
