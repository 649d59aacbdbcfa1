"""FP4 E2M1 element codes shared by NVFP4 and MXFP4: encode, decode, pack two codes per byte.

Why one module: both formats store the same 4-bit element (OCP MX v1.0 "FP4 E2M1": 1 sign bit, 2 exponent bits with
bias 1, 1 mantissa bit, no Inf/NaN) and differ only in how blocks are scaled. Everything here is plain torch and is
the specification the Triton kernels (qerl_kernels/) are tested against.

Nibble layout (the packed layout qerl_kernels/ takes from here, qerl_kernels/reference.py): bit 3 sign, bits 2-1
exponent, bit 0 mantissa; code 0..7 are the magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6 and code | 8 is the negative.
Element 2j of the last dimension goes in the LOW nibble of byte j and element 2j+1 in the HIGH nibble, which is the
convention of torch.float4_e2m1fn_x2 and of compressed-tensors' NVFP4 packing (both checked in tests/formats/).

Rounding is round-to-nearest, ties to the even code (the code whose mantissa bit is 0), saturating at +-6: the
behaviour of IEEE conversion and of torch/torchao's fp32 -> floatx helper. The sign bit follows the input's sign,
so a small negative number that rounds to zero encodes as -0 (code 8), as torchao's helper does.
"""
from __future__ import annotations

import torch

__all__ = [
    "E2M1_MAX",
    "E2M1_VALUES",
    "e2m1_encode_reference",
    "e2m1_decode",
    "pack_nibbles",
    "unpack_nibbles",
    "check_input",
]

E2M1_MAX = 6.0
# Value of each 4-bit code, index = code. Codes 8..15 are the negatives (8 is -0.0).
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)

# Midpoints between neighbouring magnitudes, and whether a tie there goes UP (the upper code is even).
# 0.25: 0|0.5 -> 0 (down); 0.75: 0.5|1 -> 1 (up); 1.25: 1|1.5 -> 1 (down); 1.75: 1.5|2 -> 2 (up);
# 2.5: 2|3 -> 2 (down); 3.5: 3|4 -> 4 (up); 5: 4|6 -> 4 (down).
_MIDPOINTS = ((0.25, False), (0.75, True), (1.25, False), (1.75, True), (2.5, False), (3.5, True), (5.0, False))


def e2m1_encode_reference(x: torch.Tensor) -> torch.Tensor:
    """Round already-scaled values to E2M1 codes (round-to-nearest-even, saturating at +-6).

    Args:
        x: float tensor of values in units of the block scale (finite; anything beyond +-6 saturates).

    Returns:
        uint8 tensor of the same shape holding one code (0..15) per element.
    """
    a = x.float().abs()
    code = torch.zeros(a.shape, dtype=torch.uint8, device=a.device)
    for mid, tie_up in _MIDPOINTS:
        code += (a >= mid if tie_up else a > mid).to(torch.uint8)
    return code | (torch.signbit(x).to(torch.uint8) << 3)


def e2m1_decode(codes: torch.Tensor) -> torch.Tensor:
    """Value of each E2M1 code.

    Args:
        codes: uint8 tensor of codes 0..15 (one per element, not packed).

    Returns:
        float32 tensor of the same shape.
    """
    table = torch.tensor(E2M1_VALUES, dtype=torch.float32, device=codes.device)
    # index_select, not table[codes]: advanced indexing costs ~10 ms per call on CPU whatever the size (torch 2.13)
    return table.index_select(0, codes.reshape(-1).long()).view(codes.shape)


def pack_nibbles(codes: torch.Tensor) -> torch.Tensor:
    """Pack codes two per byte along the last dimension: element 2j -> low nibble, 2j+1 -> high nibble.

    Args:
        codes: uint8 tensor [..., K] with K even and every value < 16.

    Returns:
        uint8 tensor [..., K // 2].

    Raises:
        ValueError: if K is odd.
    """
    if codes.shape[-1] % 2:
        raise ValueError(f"pack_nibbles: last dimension of shape {tuple(codes.shape)} must be even")
    return codes[..., 0::2] | (codes[..., 1::2] << 4)


def unpack_nibbles(packed: torch.Tensor) -> torch.Tensor:
    """Inverse of pack_nibbles: uint8 [..., K // 2] -> uint8 codes [..., K]."""
    low = packed & 0x0F
    high = packed >> 4
    return torch.stack((low, high), dim=-1).flatten(-2)


def check_input(w: torch.Tensor, block_size: int, fmt: str) -> None:
    """Reject what a block-scaled format cannot represent, naming the shape and the problem.

    Args:
        w: the tensor to quantize.
        block_size: elements per scale along the last dimension.
        fmt: format name for the message ("nvfp4", "mxfp4").

    Raises:
        ValueError: non-floating dtype, zero dimensions, a last dimension not divisible by `block_size`, or NaN/Inf.
    """
    if not torch.is_floating_point(w):
        raise ValueError(f"{fmt}.quantize: expected a floating-point tensor, got dtype {w.dtype} "
                         f"of shape {tuple(w.shape)}")
    if w.dim() == 0:
        raise ValueError(f"{fmt}.quantize: expected at least one dimension, got a 0-dim tensor")
    if w.shape[-1] % block_size:
        raise ValueError(
            f"{fmt}.quantize: the last dimension of shape {tuple(w.shape)} is {w.shape[-1]}, "
            f"which is not divisible by the block size {block_size}"
        )
    bad = (~torch.isfinite(w)).sum().item()
    if bad:
        raise ValueError(
            f"{fmt}.quantize: input of shape {tuple(w.shape)} has {bad} non-finite value(s) (NaN or Inf); "
            "4-bit formats have no encoding for them"
        )
