"""MXFP4 W4A16 kernels: fused dequantize-GEMM y = x @ W^T and a standalone dequantize, for torch and Triton.

Why: the paper's MXFP4 LoRA baseline (E2M1 codes, one E8M0 power-of-two scale per 32, no per-tensor scale). The
kernels are the NVFP4 ones (fp4_launch.py) with a different scale decoder (fp4_decoder.py); this
module holds the MXFP4 load-time preparation, the torch.library ops and the torch reference they are tested
against.

API:
    prepare(codes, scales) -> PreparedFP4              # once per weight (cached by `prepared`)
    unprepare(p) -> (codes, scales)                    # the inverse (exact where `prepare` lost nothing)
    mxfp4_linear(x, codes, scales, bias=None)          # torch.ops.qerl_kernels.mxfp4_linear
    mxfp4_linear_grad_input(grad_y, codes, scales)     # grad_y @ W (its backward)
    mxfp4_dequantize(codes, scales, dtype)             # torch.ops.qerl_kernels.mxfp4_dequantize
    mxfp4_linear_reference / mxfp4_dequantize_reference

Load-time re-biasing: with d = max(scale) - 128, the kernel sees s' = scale - d (so s' <= 128) and multiplies the
fp32 result by 2**d; bf16 then represents every block exactly, fp16 every block within 2**29 of the largest.
Blocks more than 127 binades below the largest are set to zero (they are below 2**-127 relative).

Run: `TRITON_INTERPRET=1 pytest tests/qerl_kernels -q` (CPU), `pytest tests/qerl_kernels -q` on a GPU.
"""
from __future__ import annotations

import torch

from qerl_kernels.fp4_launch import fp4_dequantize, fp4_gemm, fp4_gemm_t
from qerl_kernels.layout import PreparedCache, PreparedFP4, padded_shape, prepare_codes, unprepare_codes
from qerl_kernels.reference import mxfp4_dequantize_reference, mxfp4_linear_reference, mxfp4_quantize_reference

__all__ = ["prepare", "unprepare", "prepared", "mxfp4_linear", "mxfp4_linear_grad_input", "mxfp4_dequantize",
           "mxfp4_linear_reference", "mxfp4_dequantize_reference", "mxfp4_quantize_reference"]


def _check(codes: torch.Tensor, scales: torch.Tensor) -> tuple[int, int]:
    if codes.dim() != 2 or codes.dtype != torch.uint8:
        raise ValueError(f"mxfp4: codes must be uint8 [N, K // 2], got {codes.dtype} {tuple(codes.shape)}")
    n, k = codes.shape[0], codes.shape[1] * 2
    if k % 32 or tuple(scales.shape) != (n, k // 32) or scales.dtype != torch.uint8:
        raise ValueError(f"mxfp4: scales must be uint8 [{n}, {k // 32}] for codes {tuple(codes.shape)}, "
                         f"got {scales.dtype} {tuple(scales.shape)}")
    return n, k


def prepare(codes: torch.Tensor, scales: torch.Tensor) -> PreparedFP4:
    """Re-lay-out an MXFP4 weight for the kernels, once, on its device (one host sync for max(scale)).

    Args:
        codes: uint8 [N, K // 2].
        scales: uint8 E8M0 [N, K // 32].

    Returns:
        PreparedFP4 (scales as re-biased uint8 [N_pad, K_pad // 32]).

    Raises:
        ValueError: bad shapes or dtypes.
    """
    n, k = _check(codes, scales)
    n_pad, k_pad = padded_shape(n, k)
    d = int(scales.max().item()) - 128
    s = scales.int() - d
    dead = s < 1                                                    # > 127 binades below the largest block
    codes = codes.masked_fill(dead.repeat_interleave(16, dim=1), 0)
    s = torch.where(dead, torch.ones_like(s), s).to(torch.uint8)
    s = torch.nn.functional.pad(s, (0, k_pad // 32 - k // 32, 0, n_pad - n)).contiguous()
    out_scales = torch.full((2, n_pad), 2.0 ** d, dtype=torch.float32, device=codes.device)
    return PreparedFP4(prepare_codes(codes), s, out_scales, n, k, scale_kind=1)


def unprepare(p: PreparedFP4):
    """The storage-layout tensors of a prepared MXFP4 weight: (codes uint8 [n, k // 2], scales uint8 [n, k // 32]).

    Exact inverse of `prepare` unless some block lies more than 127 binades below the tensor's largest (`prepare`
    zeroes those: their codes come back as 0 and their scale as the smallest kept one).
    """
    if p.scale_kind != 1 or p.parts:
        raise ValueError("mxfp4.unprepare: expects a single prepared MXFP4 weight")
    codes = unprepare_codes(p.words, p.n, p.k)
    d = int(torch.frexp(p.out_scales[0, :1].float()).exponent.item()) - 1      # out_scales = 2**d
    scales = (p.scales[:p.n, :p.k // 32].to(torch.int32) + d).to(torch.uint8)
    return codes, scales


_CACHE = PreparedCache(prepare)


def prepared(codes: torch.Tensor, scales: torch.Tensor) -> PreparedFP4:
    """`prepare` with a cache keyed on the tensors (rebuilt if either is modified in place or replaced)."""
    return _CACHE.get(codes, scales)


@torch.library.custom_op("qerl_kernels::mxfp4_linear", mutates_args=())
def mxfp4_linear(x: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor,
                 bias: torch.Tensor | None = None) -> torch.Tensor:
    """y = x @ W^T (+ bias) for an MXFP4 weight W [N, K]; x [..., K].

    Returns:
        [..., N] in x's dtype.
    """
    n, k = _check(codes, scales)
    if x.shape[-1] != k:
        raise ValueError(f"mxfp4_linear: x of shape {tuple(x.shape)} does not match a weight [{n}, {k}]")
    if x.is_cuda and x.dtype in (torch.float16, torch.bfloat16):
        y = fp4_gemm(x.reshape(-1, k), prepared(codes, scales), bias)
        return y.reshape(*x.shape[:-1], n)
    return mxfp4_linear_reference(x, codes, scales, bias)


@mxfp4_linear.register_fake
def _(x, codes, scales, bias=None):
    return x.new_empty((*x.shape[:-1], codes.shape[0]))


@torch.library.custom_op("qerl_kernels::mxfp4_dequantize", mutates_args=())
def mxfp4_dequantize(codes: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The dense weight [N, K] as `dtype` (Triton on CUDA for float16/bfloat16, torch otherwise)."""
    _check(codes, scales)
    if codes.is_cuda and dtype in (torch.float16, torch.bfloat16):
        return fp4_dequantize(prepared(codes, scales), dtype)
    return mxfp4_dequantize_reference(codes, scales, dtype)


@mxfp4_dequantize.register_fake
def _(codes, scales, dtype):
    return codes.new_empty((codes.shape[0], codes.shape[1] * 2), dtype=dtype)


@torch.library.custom_op("qerl_kernels::mxfp4_linear_grad_input", mutates_args=())
def mxfp4_linear_grad_input(grad_y: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """grad_x = grad_y @ W [..., K] for grad_y [..., N] (fused transposed kernel on CUDA at small M)."""
    n, k = _check(codes, scales)
    if grad_y.is_cuda and grad_y.dtype in (torch.float16, torch.bfloat16):
        return fp4_gemm_t(grad_y.reshape(-1, n), prepared(codes, scales)).reshape(*grad_y.shape[:-1], k)
    return grad_y @ mxfp4_dequantize_reference(codes, scales, grad_y.dtype)


@mxfp4_linear_grad_input.register_fake
def _(grad_y, codes, scales):
    return grad_y.new_empty((*grad_y.shape[:-1], codes.shape[1] * 2))


def _setup(ctx, inputs, output):
    x, codes, scales, bias = inputs
    ctx.save_for_backward(codes, scales)
    ctx.has_bias = bias is not None


def _backward(ctx, grad_y):
    codes, scales = ctx.saved_tensors
    grad_b = grad_y.reshape(-1, grad_y.shape[-1]).sum(0) if ctx.has_bias else None
    return mxfp4_linear_grad_input(grad_y, codes, scales), None, None, grad_b


mxfp4_linear.register_autograd(_backward, setup_context=_setup)
