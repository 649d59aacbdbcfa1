"""Plain-torch reference for the FP4 kernels: quantize, dequantize and linear for NVFP4 and MXFP4, taken from the
format specification, qerl.formats (the one spec of the packed layout and of the quantizers).

Why here: these are the names the kernels, their CPU path and their tests use (every Triton kernel is tested against
them); each is the spec's own function (quantize: qerl.formats.nvfp4/mxfp4.quantize; dequantize: their
dequantize_tensors; packing: qerl.formats.fp4), so the kernels and the rest of the harness cannot disagree on a bit.
qerl_kernels imports nothing else from qerl (tests/test_dependencies.py).

Packed layout (qerl/formats/fp4.py, nvfp4.py, mxfp4.py):
- codes: uint8 [N, K // 2]; element 2j in the LOW nibble, 2j+1 in the HIGH nibble. E2M1 nibble: bit 3 sign,
  bits 2-1 exponent, bit 0 mantissa; magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6.
- NVFP4: scales float8_e4m3fn [N, K // 16]; global_scale float32 0-dim, a DEQUANTIZATION multiplier:
  W[n, k] = e2m1(code[n, k]) * float(scale[n, k // 16]) * global_scale.
- MXFP4: scales uint8 E8M0 [N, K // 32] (biased exponent, 127 = 1.0): W[n, k] = e2m1(code) * 2**(scale - 127).

Run the tests: `TRITON_INTERPRET=1 pytest tests/qerl_kernels -q`.
"""
from __future__ import annotations

import torch

from qerl.formats import mxfp4 as _mxfp4
from qerl.formats import nvfp4 as _nvfp4
from qerl.formats.fp4 import E2M1_VALUES
from qerl.formats.fp4 import pack_nibbles as pack_codes
from qerl.formats.fp4 import unpack_nibbles as unpack_codes

__all__ = [
    "E2M1_VALUES",
    "unpack_codes",
    "pack_codes",
    "nvfp4_quantize_reference",
    "nvfp4_dequantize_reference",
    "nvfp4_linear_reference",
    "mxfp4_quantize_reference",
    "mxfp4_dequantize_reference",
    "mxfp4_linear_reference",
    "random_quantized",
    "rel_error",
]

def nvfp4_quantize_reference(w: torch.Tensor):
    """Quantize w [N, K] (K % 16 == 0) to NVFP4 (qerl.formats.nvfp4.quantize).

    Returns:
        (codes uint8 [N, K // 2], scales float8_e4m3fn [N, K // 16], global_scale float32 0-dim).
    """
    t = _nvfp4.quantize(w.float())
    return t.codes, t.scales, t.global_scale


def nvfp4_dequantize_reference(codes: torch.Tensor, scales: torch.Tensor, global_scale: torch.Tensor,
                               dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """W [N, K] = e2m1(codes) * float(scales) per 16 * global_scale, computed in float32, returned as `dtype`."""
    return _nvfp4.dequantize_tensors(codes, scales, global_scale, dtype)


def mxfp4_quantize_reference(w: torch.Tensor):
    """Quantize w [N, K] (K % 32 == 0) to MXFP4 (qerl.formats.mxfp4.quantize; OCP MX shared exponent).

    Returns:
        (codes uint8 [N, K // 2], scales uint8 E8M0 [N, K // 32]).
    """
    t = _mxfp4.quantize(w.float())
    return t.codes, t.scales


def mxfp4_dequantize_reference(codes: torch.Tensor, scales: torch.Tensor,
                               dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """W [N, K] = e2m1(codes) * 2**(scales - 127) per 32, computed in float32, returned as `dtype`."""
    return _mxfp4.dequantize_tensors(codes, scales, dtype)


def _linear(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    # float32 accumulation over the exact dequantized weight, rounded once to x's dtype.
    y = x.float() @ w.t()
    if bias is not None:
        y = y + bias.float()
    return y.to(x.dtype)


def nvfp4_linear_reference(x, codes, scales, global_scale, bias=None):
    """y = x @ W^T (+ bias) with W the NVFP4 weight, float32 math, output in x's dtype."""
    return _linear(x, nvfp4_dequantize_reference(codes, scales, global_scale), bias)


def mxfp4_linear_reference(x, codes, scales, bias=None):
    """y = x @ W^T (+ bias) with W the MXFP4 weight, float32 math, output in x's dtype."""
    return _linear(x, mxfp4_dequantize_reference(codes, scales), bias)


def random_quantized(fmt: str, n: int, k: int, seed: int, *, scale: float = 1.0, device="cpu"):
    """A seeded random weight [n, k] (normal, rows of different scale: x exp(N(0, 1)) per row, x `scale`)
    quantized by this reference: the weights the kernel tests check.

    Returns:
        (raw, dense): raw = (codes, scales, global_scale) for nvfp4 or (codes, scales) for mxfp4, on `device`;
        dense = its exact dequantized float32 weight [n, k] on `device`.
    """
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=g) * torch.exp(torch.randn(n, 1, generator=g)) * scale
    if fmt == "nvfp4":
        raw = tuple(t.to(device) for t in nvfp4_quantize_reference(w))
        return raw, nvfp4_dequantize_reference(*raw)
    if fmt == "mxfp4":
        raw = tuple(t.to(device) for t in mxfp4_quantize_reference(w))
        return raw, mxfp4_dequantize_reference(*raw)
    raise ValueError(f"unknown 4-bit format {fmt!r}; known: ['nvfp4', 'mxfp4']")


def rel_error(a: torch.Tensor, b: torch.Tensor) -> float:
    """||a - b|| / ||b|| in float32 (the kernels' accuracy measure)."""
    return ((a.float() - b.float()).norm() / b.float().norm().clamp(min=1e-30)).item()
