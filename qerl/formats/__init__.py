"""4-bit weight formats as plain torch tensor math (no nn.Module): NVFP4, MXFP4 and their shared E2M1 element.

`quantize(w, fmt)` / `dequantize(packed)` dispatch on the format name or the packed type; the per-format modules hold
the specification (see their docstrings for the packed layout), which the kernels (qerl_kernels/reference.py) and the
torch layer (qerl.layers) take from here.
"""
from __future__ import annotations

import torch

from qerl.formats import fp4, mxfp4, nvfp4
from qerl.formats.mxfp4 import MXFP4Tensor
from qerl.formats.nvfp4 import NVFP4Tensor

__all__ = ["fp4", "nvfp4", "mxfp4", "NVFP4Tensor", "MXFP4Tensor", "FORMATS", "BITS_PER_WEIGHT", "quantize",
           "dequantize"]

FORMATS = {"nvfp4": nvfp4, "mxfp4": mxfp4}
# Storage cost per weight of each format: 4 bits + one 8-bit scale per block (NVFP4 also has 4 bytes per tensor).
BITS_PER_WEIGHT = {"nvfp4": 4 + 8 / nvfp4.BLOCK_SIZE, "mxfp4": 4 + 8 / mxfp4.BLOCK_SIZE}


def quantize(w: torch.Tensor, fmt: str) -> NVFP4Tensor | MXFP4Tensor:
    """Quantize `w` over its last dimension to `fmt` ("nvfp4" or "mxfp4").

    Raises:
        ValueError: unknown format, or anything the format's own quantize rejects.
    """
    if fmt not in FORMATS:
        raise ValueError(f"unknown 4-bit format {fmt!r}; known: {sorted(FORMATS)}")
    return FORMATS[fmt].quantize(w)


def dequantize(packed: NVFP4Tensor | MXFP4Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """Dequantize a packed tensor of either format (to its original dtype unless `dtype` is given)."""
    if isinstance(packed, NVFP4Tensor):
        return nvfp4.dequantize(packed, dtype)
    if isinstance(packed, MXFP4Tensor):
        return mxfp4.dequantize(packed, dtype)
    raise ValueError(f"dequantize: expected NVFP4Tensor or MXFP4Tensor, got {type(packed).__name__}")
