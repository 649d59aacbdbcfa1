"""Triton W4A16 kernels for NVFP4 and MXFP4, their torch references and benchmarks.

Public API (CUDA tensors run the Triton kernels, CPU tensors the torch reference):
    fp4_linear(x, codes, scales, global_scale, bias, fmt)      y = x @ W^T + bias, W in the storage layout
    fp4_dequantize_weight(codes, scales, global_scale, fmt, dtype)
    nvfp4.* / mxfp4.*   per-format ops (torch.ops.qerl_kernels.*), prepare() for the kernel layout
    reference.*         the plain-torch specification
See kernels/_common.py for how the kernels work and kernels/bench.py for how they are measured.
"""
from __future__ import annotations

import torch

from kernels import mxfp4, nvfp4, reference

__all__ = ["fp4_linear", "fp4_dequantize_weight", "nvfp4", "mxfp4", "reference"]


def fp4_linear(x: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor, global_scale: torch.Tensor | None,
               bias: torch.Tensor | None, fmt: str) -> torch.Tensor:
    """y = x @ W^T (+ bias) for a packed 4-bit weight (fmt "nvfp4" or "mxfp4"); fp32 accumulation.

    Raises:
        ValueError: unknown format or mismatched shapes.
    """
    if fmt == "nvfp4":
        return nvfp4.nvfp4_linear(x, codes, scales, global_scale, bias)
    if fmt == "mxfp4":
        return mxfp4.mxfp4_linear(x, codes, scales, bias)
    raise ValueError(f"unknown 4-bit format {fmt!r}; known: ['nvfp4', 'mxfp4']")


def fp4_dequantize_weight(codes: torch.Tensor, scales: torch.Tensor, global_scale: torch.Tensor | None, fmt: str,
                          dtype: torch.dtype) -> torch.Tensor:
    """The dense weight [N, K] as `dtype` (one rounding of the exact value)."""
    if fmt == "nvfp4":
        return nvfp4.nvfp4_dequantize(codes, scales, global_scale, dtype)
    if fmt == "mxfp4":
        return mxfp4.mxfp4_dequantize(codes, scales, dtype)
    raise ValueError(f"unknown 4-bit format {fmt!r}; known: ['nvfp4', 'mxfp4']")
