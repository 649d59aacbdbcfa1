"""Plain-torch reference for the FP4 kernels: quantize, dequantize and linear for NVFP4 and MXFP4.

Why a second reference beside qerl/formats: the kernels were written in parallel with the formats module, so they
carry their own small specification of the packed layout (the contract below) and a test checks that both agree
bit for bit on the same packed tensors (tests/qerl_kernels/test_kernels_reference.py). These functions are also the CPU
path of the kernel entry points and what every Triton kernel is tested against.

Packed layout (the contract with qerl/formats):
- codes: uint8 [N, K // 2]; element 2j in the LOW nibble, 2j+1 in the HIGH nibble. E2M1 nibble: bit 3 sign,
  bits 2-1 exponent, bit 0 mantissa; magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6.
- NVFP4: scales float8_e4m3fn [N, K // 16]; global_scale float32 0-dim, a DEQUANTIZATION multiplier:
  W[n, k] = e2m1(code[n, k]) * float(scale[n, k // 16]) * global_scale.
- MXFP4: scales uint8 E8M0 [N, K // 32] (biased exponent, 127 = 1.0): W[n, k] = e2m1(code) * 2**(scale - 127).

The quantizers here are simple (round to nearest E2M1 value, ties to the larger magnitude) and exist to make test
inputs; the project's quantizers are qerl.formats.nvfp4/mxfp4.quantize.

Run the tests: `TRITON_INTERPRET=1 pytest tests/qerl_kernels -q`.
"""
from __future__ import annotations

import torch

__all__ = [
    "E2M1_VALUES",
    "unpack_codes",
    "pack_codes",
    "e2m1_round",
    "nvfp4_quantize_reference",
    "nvfp4_dequantize_reference",
    "nvfp4_linear_reference",
    "mxfp4_quantize_reference",
    "mxfp4_dequantize_reference",
    "mxfp4_linear_reference",
    "random_quantized",
    "rel_error",
]

E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)
_E4M3_MAX = 448.0


def unpack_codes(packed: torch.Tensor) -> torch.Tensor:
    """uint8 [N, K // 2] -> uint8 codes [N, K] (low nibble first)."""
    return torch.stack((packed & 0x0F, packed >> 4), dim=-1).flatten(-2)


def pack_codes(codes: torch.Tensor) -> torch.Tensor:
    """uint8 codes [N, K] (values < 16, K even) -> uint8 [N, K // 2]."""
    return codes[..., 0::2] | (codes[..., 1::2] << 4)


def e2m1_round(x: torch.Tensor) -> torch.Tensor:
    """Nearest E2M1 code of each value (already divided by its block scale), saturating at +-6.

    Args:
        x: float tensor.

    Returns:
        uint8 codes, same shape.
    """
    mags = torch.tensor(E2M1_VALUES[:8], dtype=torch.float32, device=x.device)
    a = x.float().abs().clamp(max=6.0)
    code = (a[..., None] - mags).abs().argmin(dim=-1).to(torch.uint8)
    return code | ((x < 0).to(torch.uint8) << 3)


def _e2m1_values(packed: torch.Tensor) -> torch.Tensor:
    table = torch.tensor(E2M1_VALUES, dtype=torch.float32, device=packed.device)
    return table[unpack_codes(packed).long()]


def nvfp4_quantize_reference(w: torch.Tensor):
    """Quantize w [N, K] (K % 16 == 0) to NVFP4.

    Returns:
        (codes uint8 [N, K // 2], scales float8_e4m3fn [N, K // 16], global_scale float32 0-dim).
    """
    w = w.float()
    amax = w.abs().amax()
    gs = torch.where(amax > 0, amax / (_E4M3_MAX * 6.0), torch.ones_like(amax))
    blocks = w.reshape(w.shape[0], -1, 16)
    scales = (blocks.abs().amax(-1) / 6.0 / gs).clamp(max=_E4M3_MAX).to(torch.float8_e4m3fn)
    step = (scales.float() * gs)[..., None]
    scaled = torch.where(step > 0, blocks / step, torch.zeros_like(blocks))
    return pack_codes(e2m1_round(scaled).reshape(w.shape)), scales, gs.reshape(())


def nvfp4_dequantize_reference(codes: torch.Tensor, scales: torch.Tensor, global_scale: torch.Tensor,
                               dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """W [N, K] = e2m1(codes) * float(scales) per 16 * global_scale, computed in float32, returned as `dtype`."""
    vals = _e2m1_values(codes)
    n, k = vals.shape
    w = vals.reshape(n, k // 16, 16) * scales.float()[..., None] * global_scale.float()
    return w.reshape(n, k).to(dtype)


def mxfp4_quantize_reference(w: torch.Tensor):
    """Quantize w [N, K] (K % 32 == 0) to MXFP4 (OCP MX: shared exponent floor(log2(amax)) - 2).

    Returns:
        (codes uint8 [N, K // 2], scales uint8 E8M0 [N, K // 32]).
    """
    w = w.float()
    blocks = w.reshape(w.shape[0], -1, 32)
    amax = blocks.abs().amax(-1)
    e = torch.floor(torch.log2(amax.clamp(min=2.0 ** -125))) - 2
    scales = (e + 127).clamp(0, 254).to(torch.uint8)
    scaled = torch.ldexp(blocks, (127 - scales.int())[..., None].float())
    return pack_codes(e2m1_round(scaled).reshape(w.shape)), scales


def mxfp4_dequantize_reference(codes: torch.Tensor, scales: torch.Tensor,
                               dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """W [N, K] = e2m1(codes) * 2**(scales - 127) per 32, computed in float32, returned as `dtype`."""
    vals = _e2m1_values(codes)
    n, k = vals.shape
    w = torch.ldexp(vals.reshape(n, k // 32, 32), (scales.int() - 127)[..., None].float())
    return w.reshape(n, k).to(dtype)


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
