"""NVFP4: E2M1 elements, one FP8-E4M3 scale per 16 elements, one FP32 per-tensor scale (paper Eq. 6).

Why: QeRL keeps the frozen base weights in NVFP4 so that rollouts run on FP4 tensor cores (Marlin on Hopper, native on
Blackwell). This module is the torch specification of the format; the Triton kernels in qerl_kernels/ and the checkpoint
I/O in qerl/policy/checkpoint.py are tested against it.

How (over the last dimension, in blocks of 16):
    global_scale = amax(|W|) / (448 * 6)                       # FP32, a DEQUANTIZATION multiplier
    scale_b      = e4m3(amax_b(|W|) / 6 / global_scale)         # in [0, 448], round-to-nearest-even by torch's cast
    code         = e2m1(W / (float(scale_b) * global_scale))    # round-to-nearest-even, saturating at +-6
    W_hat        = e2m1_value(code) * float(scale_b) * global_scale
The global scale maps the largest block scale onto E4M3's maximum (448), so block scales use E4M3's whole range.
compressed-tensors stores the reciprocal (its `weight_global_scale` = 448 * 6 / amax); the conversion happens only in
checkpoint I/O.

Packed layout (qerl_kernels/ takes it from here, qerl_kernels/reference.py): `codes` uint8 [..., K // 2], element 2j
in the low nibble, 2j+1 in the high nibble; `scales` torch.float8_e4m3fn [..., K // 16]; `global_scale` float32 0-dim tensor.

Edge cases and deviations:
- An all-zero tensor gets global_scale = 1 (any positive value would do); an all-zero block gets scale 0 and codes 0.
- global_scale is clamped below at FP32's smallest normal number, so a tensor whose amax is below about 3e-35 is
  quantized with coarser block scales instead of producing Inf; a block that is more than about 2**9 * 448 times
  smaller than the tensor's largest block underflows E4M3 and dequantizes to zero (inherent to the format).
- torchao's and torch's vendored reference clamp block scales below at E4M3's smallest NORMAL (2**-6); we keep the
  subnormal scales, which is strictly more accurate for small blocks. The two agree wherever no block scale is below
  2**-6 (tested).
- NaN/Inf inputs and a last dimension not divisible by 16 raise ValueError.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from qerl.formats.fp4 import E2M1_MAX, check_input, e2m1_decode, e2m1_encode_reference, pack_nibbles, unpack_nibbles

__all__ = ["BLOCK_SIZE", "E4M3_MAX", "NVFP4Tensor", "quantize", "dequantize", "dequantize_tensors", "global_scale_for"]

BLOCK_SIZE = 16
E4M3_MAX = float(torch.finfo(torch.float8_e4m3fn).max)  # 448
_FP32_TINY = float(torch.finfo(torch.float32).tiny)


@dataclass(frozen=True)
class NVFP4Tensor:
    """A quantized tensor in NVFP4 (see the module docstring for the layout).

    Attributes:
        codes: uint8 [..., K // 2], two E2M1 codes per byte (element 2j in the low nibble).
        scales: float8_e4m3fn [..., K // 16].
        global_scale: float32 0-dim tensor; W = e2m1 * float(scales) * global_scale.
        shape: the original shape [..., K].
        dtype: the original dtype (what dequantize returns by default).
    """

    codes: torch.Tensor
    scales: torch.Tensor
    global_scale: torch.Tensor
    shape: torch.Size
    dtype: torch.dtype

    @property
    def nbytes(self) -> int:
        """Bytes held by the packed tensors (4.5 bits per element plus 4 bytes)."""
        return sum(t.numel() * t.element_size() for t in (self.codes, self.scales, self.global_scale))

    def to(self, device) -> "NVFP4Tensor":
        """The same tensor on `device`."""
        return NVFP4Tensor(self.codes.to(device), self.scales.to(device), self.global_scale.to(device),
                           self.shape, self.dtype)


def global_scale_for(w: torch.Tensor) -> torch.Tensor:
    """The per-tensor dequantization scale amax / (448 * 6) (1 for an all-zero tensor), float32 0-dim."""
    amax = w.detach().abs().amax().float()
    gs = torch.where(amax > 0, amax / (E4M3_MAX * E2M1_MAX), torch.ones_like(amax))
    return gs.clamp(min=_FP32_TINY)


def quantize(w: torch.Tensor, global_scale: torch.Tensor | None = None) -> NVFP4Tensor:
    """Quantize `w` to NVFP4 over its last dimension.

    Args:
        w: floating tensor [..., K], K divisible by 16, finite.
        global_scale: optional float32 dequantization multiplier to use instead of amax / (448 * 6) (block scales
            that would exceed 448 under it saturate).

    Returns:
        NVFP4Tensor with codes [..., K // 2], scales [..., K // 16], global_scale 0-dim.

    Raises:
        ValueError: non-float dtype, K not divisible by 16 (the message names the shape), NaN or Inf in `w`.
    """
    check_input(w, BLOCK_SIZE, "nvfp4")
    w = w.detach()
    gs = global_scale_for(w) if global_scale is None else global_scale.detach().float().reshape(())
    gs = gs.to(w.device)
    blocks = w.float().reshape(*w.shape[:-1], w.shape[-1] // BLOCK_SIZE, BLOCK_SIZE)
    block_amax = blocks.abs().amax(dim=-1)
    scales = (block_amax / E2M1_MAX / gs).clamp(max=E4M3_MAX).to(torch.float8_e4m3fn)
    step = scales.float() * gs  # [..., K // 16] effective scale of each block
    scaled = torch.where(step[..., None] > 0, blocks / step[..., None], torch.zeros_like(blocks))
    codes = pack_nibbles(e2m1_encode_reference(scaled.reshape(w.shape)))
    return NVFP4Tensor(codes, scales, gs, w.shape, w.dtype)


def dequantize(packed: NVFP4Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """Values of an NVFP4 tensor: e2m1 * float(scale) * global_scale, computed in float32.

    Args:
        packed: the NVFP4Tensor.
        dtype: output dtype (default: the dtype the tensor was quantized from).

    Returns:
        Tensor of shape packed.shape.
    """
    return dequantize_tensors(packed.codes, packed.scales, packed.global_scale, dtype or packed.dtype)


def dequantize_tensors(codes: torch.Tensor, scales: torch.Tensor, global_scale: torch.Tensor,
                       dtype: torch.dtype) -> torch.Tensor:
    """dequantize() on the raw tensors (what QuantLinear and the kernel entry point hold).

    Args:
        codes: uint8 [..., K // 2].
        scales: float8_e4m3fn [..., K // 16].
        global_scale: float32 0-dim.
        dtype: output dtype.

    Returns:
        Tensor [..., K] of `dtype`.
    """
    vals = e2m1_decode(unpack_nibbles(codes))  # [..., K]
    shape = vals.shape
    vals = vals.reshape(*shape[:-1], shape[-1] // BLOCK_SIZE, BLOCK_SIZE)
    out = vals * scales.float()[..., None] * global_scale.float()
    return out.reshape(shape).to(dtype)
