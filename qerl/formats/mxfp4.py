"""MXFP4 (OCP Microscaling Formats v1.0): E2M1 elements, one E8M0 power-of-two scale per 32 elements.

Why: the paper's MXFP4 LoRA baseline. The format has no per-tensor scale and its block scale is a bare power of two,
so it rounds more coarsely than NVFP4 (block 32 instead of 16, scale steps of 2x instead of E4M3's ~6%).

How (over the last dimension, in blocks of 32), following OCP MX v1.0 section 6.3:
    shared_exp = floor(log2(amax_b(|W|))) - emax_elem,  emax_elem = 2 for E2M1 (its largest value 6 = 1.5 * 2**2)
    scale_b    = shared_exp + 127                          # E8M0 biased exponent, clamped to [0, 254]
    code       = e2m1(W / 2**shared_exp)                   # round-to-nearest-even; values above 6 saturate to 6
    W_hat      = e2m1_value(code) * 2**(scale_b - 127)
floor(log2(amax)) is read from the FP32 exponent field (torchao's "FLOOR" mode), so a block whose amax lies in
[6 * 2**e, 8 * 2**e) saturates its largest elements to 6: that clipping is part of the spec's choice of scale.

Packed layout (qerl_kernels/ takes it from here, qerl_kernels/reference.py): `codes` uint8 [..., K // 2], element 2j
in the low nibble; `scales` uint8 [..., K // 32] holding the biased exponent (127 = 1.0), bit-identical to
torch.float8_e8m0fnu (tested).

Edge cases and deviations:
- An all-zero block (and any block with amax below 2**-125) gets the smallest scale, biased 0 (2**-127); E8M0's NaN
  encoding 255 is never produced.
- NaN/Inf inputs and a last dimension not divisible by 32 raise ValueError (the spec would set the scale to NaN).
- Other quantizers pick the exponent differently: compressed-tensors (llm-compressor's MXFP4) rounds amax to a power
  of two at E2M1's mantissa precision, i.e. one exponent higher wherever amax's mantissa is >= 1.75 (tested in
  tests/quantize/test_checkpoint.py). Both write the same file layout; dequantization is identical.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from qerl.formats.fp4 import check_input, e2m1_decode, e2m1_encode_reference, pack_nibbles, unpack_nibbles

__all__ = ["BLOCK_SIZE", "E8M0_BIAS", "EMAX_ELEM", "MXFP4Tensor", "quantize", "dequantize", "dequantize_tensors",
           "shared_exponent"]

BLOCK_SIZE = 32
E8M0_BIAS = 127
EMAX_ELEM = 2  # exponent of E2M1's largest normal value (6 = 1.5 * 2**2)


@dataclass(frozen=True)
class MXFP4Tensor:
    """A quantized tensor in MXFP4 (see the module docstring for the layout).

    Attributes:
        codes: uint8 [..., K // 2], two E2M1 codes per byte (element 2j in the low nibble).
        scales: uint8 [..., K // 32], E8M0 biased exponents; W = e2m1 * 2**(scales - 127).
        shape: the original shape [..., K].
        dtype: the original dtype (what dequantize returns by default).
    """

    codes: torch.Tensor
    scales: torch.Tensor
    shape: torch.Size
    dtype: torch.dtype

    @property
    def nbytes(self) -> int:
        """Bytes held by the packed tensors (4.25 bits per element)."""
        return sum(t.numel() * t.element_size() for t in (self.codes, self.scales))

    def to(self, device) -> "MXFP4Tensor":
        """The same tensor on `device`."""
        return MXFP4Tensor(self.codes.to(device), self.scales.to(device), self.shape, self.dtype)


def shared_exponent(block_amax: torch.Tensor) -> torch.Tensor:
    """OCP MX v1.0 shared exponent floor(log2(amax)) - 2, biased by 127 and clamped to E8M0's finite range.

    Args:
        block_amax: float tensor of per-block max |x| (finite, >= 0).

    Returns:
        uint8 tensor of biased exponents in [0, 254].
    """
    bits = block_amax.float().contiguous().view(torch.int32)
    floor_log2 = ((bits >> 23) & 0xFF) - 127  # exponent field; zero and subnormals give -127 (then clamp)
    return (floor_log2 - EMAX_ELEM + E8M0_BIAS).clamp(0, 254).to(torch.uint8)


def quantize(w: torch.Tensor) -> MXFP4Tensor:
    """Quantize `w` to MXFP4 over its last dimension.

    Args:
        w: floating tensor [..., K], K divisible by 32, finite.

    Returns:
        MXFP4Tensor with codes [..., K // 2] and scales [..., K // 32].

    Raises:
        ValueError: non-float dtype, K not divisible by 32 (the message names the shape), NaN or Inf in `w`.
    """
    check_input(w, BLOCK_SIZE, "mxfp4")
    w = w.detach()
    blocks = w.float().reshape(*w.shape[:-1], w.shape[-1] // BLOCK_SIZE, BLOCK_SIZE)
    scales = shared_exponent(blocks.abs().amax(dim=-1))
    # ldexp by the negated exponent is exact (no 2**-127 subnormal flush on the way).
    scaled = torch.ldexp(blocks, (E8M0_BIAS - scales.int())[..., None].float())
    codes = pack_nibbles(e2m1_encode_reference(scaled.reshape(w.shape)))
    return MXFP4Tensor(codes, scales, w.shape, w.dtype)


def dequantize(packed: MXFP4Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """Values of an MXFP4 tensor: e2m1 * 2**(scale - 127), computed in float32.

    Args:
        packed: the MXFP4Tensor.
        dtype: output dtype (default: the dtype the tensor was quantized from).

    Returns:
        Tensor of shape packed.shape.
    """
    return dequantize_tensors(packed.codes, packed.scales, dtype or packed.dtype)


def dequantize_tensors(codes: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """dequantize() on the raw tensors (what QuantLinear and the kernel entry point hold).

    Args:
        codes: uint8 [..., K // 2].
        scales: uint8 [..., K // 32], biased E8M0 exponents.
        dtype: output dtype.

    Returns:
        Tensor [..., K] of `dtype`.
    """
    vals = e2m1_decode(unpack_nibbles(codes))  # [..., K]
    shape = vals.shape
    vals = vals.reshape(*shape[:-1], shape[-1] // BLOCK_SIZE, BLOCK_SIZE)
    out = torch.ldexp(vals, (scales.int() - E8M0_BIAS)[..., None].float())
    return out.reshape(shape).to(dtype)
