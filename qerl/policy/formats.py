"""Weight formats of a policy's frozen base: one dispatch from a format name to its conversion, for every caller.

Why one dispatch: the trainer, the evaluator, the quantization stage and the profilers all turn a model's
q/k/v/o/gate/up/down linears into BF16 (nothing to do), NVFP4 or MXFP4 (qerl.layers.QuantLinear, round-to-nearest)
or NF4 (bitsandbytes, QLoRA's recipe, from `baselines.nf4`). They all go through the same `quantize_`-shaped entry,
`quantize_model(model, fmt)`, which picks the format's config (`format_config`) and calls `qerl.layers.quantize_`;
NF4 is no special case beyond the two flags transformers sets on a 4-bit model. Memory accounting and format
detection live here for the same reason (NF4's absmax constants are outside the module's buffers).

    quantize_model(model, "nvfp4")                       # in place, default targets
    layer = convert_linear(nn.Linear(64, 64), "nf4")     # one layer (the profilers build 72B models layer by layer)
    weight_nbytes(model), checkpoint_format(model)

This module (with qerl.policy) is the only importer of `baselines` outside the quantization stage.
Run the tests: `pytest tests/policy -q`.
"""
from __future__ import annotations

import torch
from torch import nn

from qerl.contract.methods import WEIGHT_FORMATS

__all__ = ["FORMATS", "DTYPES", "torch_dtype", "format_config", "quantize_model", "convert_linear",
           "keep_trainable_layout", "checkpoint_format", "weight_nbytes", "nf4_problem",
           "decode_dequantized", "dequantized_weight"]

FORMATS = WEIGHT_FORMATS  # ("bf16", "nf4", "mxfp4", "nvfp4")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def torch_dtype(dtype: str | torch.dtype) -> torch.dtype:
    """A torch dtype from its config name ("float32", "bfloat16", "float16") or itself.

    Raises:
        ValueError: an unknown name, naming the config key model.dtype.
    """
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in DTYPES:
        raise ValueError(f"config key 'model.dtype': unknown dtype {dtype!r}; known: {sorted(DTYPES)}")
    return DTYPES[dtype]


def _check(fmt: str) -> None:
    if fmt not in FORMATS:
        raise ValueError(f"--format {fmt!r}: unknown weight format; known: {list(FORMATS)}")


def format_config(fmt: str, targets: tuple[str, ...] | None = None, compute_dtype: torch.dtype | None = None):
    """The `qerl.layers.quantize_` config of a 4-bit format.

    Args:
        fmt: "nvfp4", "mxfp4" or "nf4".
        targets: last name components of the layers to convert (default q/k/v/o/gate/up/down).
        compute_dtype: NF4's matmul dtype (None: each layer's own); the FP4 layers compute in the input's dtype.

    Returns:
        NVFP4Config, MXFP4Config or baselines.nf4.NF4Config.

    Raises:
        ValueError: bf16 (nothing to convert) or an unknown format.
    """
    from qerl.layers import DEFAULT_TARGETS, MXFP4Config, NVFP4Config

    _check(fmt)
    targets = tuple(targets or DEFAULT_TARGETS)
    if fmt == "nvfp4":
        return NVFP4Config(targets=targets)
    if fmt == "mxfp4":
        return MXFP4Config(targets=targets)
    if fmt == "nf4":
        from baselines.nf4 import NF4Config

        return NF4Config(targets=targets, compute_dtype=compute_dtype)
    raise ValueError("format 'bf16' keeps the weights as they are: there is no conversion config")


def keep_trainable_layout(model: nn.Module) -> nn.Module:
    """Stop bitsandbytes from repacking CPU NF4 weights into its inference layout on the first no-grad forward
    (a rollout), after which training through them breaks autograd (baselines/nf4.py); returns the model."""
    from baselines.nf4 import keep_trainable_layout as keep

    return keep(model)


def quantize_model(model: nn.Module, fmt: str, targets: tuple[str, ...] | None = None,
                   compute_dtype: torch.dtype | None = None) -> nn.Module:
    """Convert the model's target linears to `fmt`, in place (bf16: nothing to do).

    NF4 also gets the flag transformers sets on a 4-bit model (so peft wraps the layers with its bitsandbytes-aware
    LoRA layer) and keeps the trainable layout on CPU (`keep_trainable_layout`).

    Args:
        model: an unquantized transformers model.
        fmt: one of FORMATS.
        targets: last name components of the layers to quantize (default q/k/v/o/gate/up/down).
        compute_dtype: NF4's matmul dtype (None: the layer's dtype).

    Returns:
        The same model.

    Raises:
        ValueError: unknown format, or a layer that cannot be converted (named by quantize_).
        RuntimeError: NF4 where bitsandbytes cannot quantize on this device.
    """
    from qerl.layers import quantize_

    _check(fmt)
    if fmt == "bf16":
        return model
    quantize_(model, format_config(fmt, targets, compute_dtype))
    if fmt == "nf4":
        model.is_loaded_in_4bit = True
        keep_trainable_layout(model)
    return model


def convert_linear(linear: nn.Linear, fmt: str, dtype: torch.dtype | None = None) -> nn.Module:
    """One nn.Linear in a 4-bit format, on the layer's device (what `quantize_model` puts in its place).

    Args:
        linear: the layer.
        fmt: "nvfp4", "mxfp4" or "nf4".
        dtype: compute dtype of the new layer (default: the linear's).

    Returns:
        A QuantLinear (nvfp4, mxfp4) or a bitsandbytes Linear4bit (nf4).

    Raises:
        ValueError: bf16 or an unknown format, or a shape the format cannot hold.
        RuntimeError: NF4 where bitsandbytes cannot quantize on this device.
    """
    dtype = dtype or linear.weight.dtype
    layer = format_config(fmt, compute_dtype=dtype).convert(linear)
    return layer if fmt == "nf4" else layer.to(dtype)


def checkpoint_format(model: nn.Module) -> str:
    """The weight format of a loaded model: nvfp4 / mxfp4 (QuantLinear), nf4 (bitsandbytes 4-bit) or bf16 (neither).

    Raises:
        ValueError: if it mixes formats.
    """
    from qerl.layers import QuantLinear

    found = set()
    for m in model.modules():
        if isinstance(m, QuantLinear):
            found.add(m.fmt)
        elif type(m).__name__ == "Linear4bit":
            found.add("nf4")
    if len(found) > 1:
        raise ValueError(f"the model mixes weight formats {sorted(found)}")
    return found.pop() if found else "bf16"


def weight_nbytes(model: nn.Module) -> int:
    """Bytes of a model's parameters and buffers (tied storages once), plus NF4 layers' absmax constants."""
    from baselines.nf4 import nf4_nbytes

    return nf4_nbytes(model)


def nf4_problem() -> str | None:
    """None when bitsandbytes can quantize and run an NF4 layer on the CPU here, else the reason."""
    from baselines.nf4 import bitsandbytes_cpu_problem

    return bitsandbytes_cpu_problem()


def decode_dequantized(module: nn.Module) -> bool:
    """Whether the decode engine runs this bitsandbytes NF4 layer from a dequantized copy of its weight (config
    model.nf4_decode: dequantized; baselines.nf4.mark_decode_dequantized marks the layers)."""
    from baselines.nf4 import DECODE_DEQUANTIZED

    return bool(getattr(module, DECODE_DEQUANTIZED, False))


def dequantized_weight(layer: nn.Module, dtype: torch.dtype) -> torch.Tensor:
    """The [out, in] weight of a bitsandbytes NF4 layer, dequantized as its forward does, in `dtype`."""
    from baselines.nf4 import dequantized_weight as dequantize

    return dequantize(layer, dtype)
