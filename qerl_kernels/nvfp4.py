"""NVFP4 W4A16 kernels: fused dequantize-GEMM y = x @ W^T and a standalone dequantize, for torch and Triton.

Why: QeRL's rollouts and training keep the frozen weights in NVFP4 (E2M1 codes, an E4M3 scale per 16, an fp32
per-tensor scale). The released training path dequantizes to bf16 on every call; these kernels read the 4.5-bit
weight directly. The kernels themselves live in fp4_launch.py and the modules it names (layout, decoder,
Triton kernels, tuning), shared with MXFP4; this module holds the NVFP4 load-time preparation, the torch.library
ops and the torch reference they are tested against.

API:
    prepare(codes, scales, global_scale) -> PreparedFP4     # once per weight (cached by `prepared`)
    unprepare(p) -> (codes, scales, global_scale)           # the inverse (exact where `prepare` lost nothing)
    nvfp4_linear(x, codes, scales, global_scale, bias=None) # torch.ops.qerl_kernels.nvfp4_linear
    nvfp4_linear_grad_input(grad_y, codes, scales, global_scale)   # grad_y @ W (its backward)
    nvfp4_dequantize(codes, scales, global_scale, dtype)    # torch.ops.qerl_kernels.nvfp4_dequantize
    nvfp4_linear_reference / nvfp4_dequantize_reference     # plain torch (reference.py)
CUDA inputs run the Triton kernels; CPU inputs run the torch reference (same numerics: exact weights, fp32 sums).

Run: `TRITON_INTERPRET=1 pytest tests/qerl_kernels -q` (CPU), `pytest tests/qerl_kernels -q` on a GPU,
`python -m qerl_kernels.bench` for speed.
"""
from __future__ import annotations

import torch

from qerl_kernels.fp4_launch import fp4_dequantize, fp4_gemm, fp4_gemm_t
from qerl_kernels.layout import (PreparedCache, PreparedFP4, e4m3_to_e5m3, e5m3_to_float, padded_shape, prepare_codes,
                            row_out_scales, unprepare_codes)
from qerl_kernels.reference import nvfp4_dequantize_reference, nvfp4_linear_reference, nvfp4_quantize_reference

__all__ = ["prepare", "unprepare", "prepared", "nvfp4_linear", "nvfp4_linear_grad_input", "nvfp4_dequantize",
           "nvfp4_linear_reference", "nvfp4_dequantize_reference", "nvfp4_quantize_reference"]


def _check(codes: torch.Tensor, scales: torch.Tensor, global_scale: torch.Tensor) -> tuple[int, int]:
    if codes.dim() != 2 or codes.dtype != torch.uint8:
        raise ValueError(f"nvfp4: codes must be uint8 [N, K // 2], got {codes.dtype} {tuple(codes.shape)}")
    n, k = codes.shape[0], codes.shape[1] * 2
    if k % 16 or tuple(scales.shape) != (n, k // 16) or scales.dtype != torch.float8_e4m3fn:
        raise ValueError(f"nvfp4: scales must be float8_e4m3fn [{n}, {k // 16}] for codes {tuple(codes.shape)}, "
                         f"got {scales.dtype} {tuple(scales.shape)}")
    if global_scale.numel() != 1:
        raise ValueError(f"nvfp4: global_scale must hold one value, got shape {tuple(global_scale.shape)}")
    return n, k


def prepare(codes: torch.Tensor, scales: torch.Tensor, global_scale: torch.Tensor) -> PreparedFP4:
    """Re-lay-out an NVFP4 weight for the kernels (see layout.prepare_codes), once, on its device.

    Args:
        codes: uint8 [N, K // 2] (storage contract: element 2j in the low nibble).
        scales: float8_e4m3fn [N, K // 16].
        global_scale: float32 with one value (dequantization multiplier).

    Returns:
        PreparedFP4 with 4.5 bits per weight plus padding of rows to 128 and columns to 128.

    Raises:
        ValueError: bad shapes or dtypes (the message names them).
    """
    n, k = _check(codes, scales, global_scale)
    n_pad, k_pad = padded_shape(n, k)
    zero = (scales.float() == 0).repeat_interleave(8, dim=1)        # blocks with scale 0 decode to 0: zero codes
    codes = codes.masked_fill(zero, 0)
    q = e4m3_to_e5m3(scales)
    q = torch.nn.functional.pad(q, (0, k_pad // 16 - k // 16, 0, n_pad - n)).contiguous()
    gs = global_scale.detach().float().reshape(1)
    # fp16 MMA: weights decode as w * 2**-14; bf16 MMA: as w * 2**-62 (see fp4_decoder._scale_pairs).
    out_scales = row_out_scales(torch.cat((gs * 2.0 ** 14, gs * 2.0 ** 62)), n_pad)
    return PreparedFP4(prepare_codes(codes), q.view(torch.int16), out_scales, n, k, scale_kind=0)


def unprepare(p: PreparedFP4):
    """The storage-layout tensors of a prepared NVFP4 weight: (codes uint8 [n, k // 2], scales float8_e4m3fn
    [n, k // 16], global_scale float32 0-dim).

    Exact inverse of `prepare` for weights whose zero-scale blocks hold zero codes and whose scales are finite and
    non-negative (what the quantizers produce); otherwise the codes of zero-scale blocks come back as 0 and
    negative / non-finite scales as 0 (`prepare` does not keep them: they decode to 0 either way).
    """
    if p.scale_kind != 0 or p.parts:
        raise ValueError("nvfp4.unprepare: expects a single prepared NVFP4 weight")
    codes = unprepare_codes(p.words, p.n, p.k)
    q = p.scales.contiguous().view(torch.uint8)[:p.n, :p.k // 16]
    scales = e5m3_to_float(q).to(torch.float8_e4m3fn)
    gs = (p.out_scales[1, 0].float() * 2.0 ** -62).reshape(())
    return codes, scales, gs


_CACHE = PreparedCache(prepare)


def prepared(codes: torch.Tensor, scales: torch.Tensor, global_scale: torch.Tensor) -> PreparedFP4:
    """`prepare` with a cache keyed on the tensors (rebuilt if any of them is modified in place or replaced)."""
    return _CACHE.get(codes, scales, global_scale)


@torch.library.custom_op("qerl_kernels::nvfp4_linear", mutates_args=())
def nvfp4_linear(x: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor, global_scale: torch.Tensor,
                 bias: torch.Tensor | None = None) -> torch.Tensor:
    """y = x @ W^T (+ bias) for an NVFP4 weight W [N, K]; x [..., K] float16/bfloat16 (CUDA) or any float (CPU).

    Returns:
        [..., N] in x's dtype.
    """
    n, k = _check(codes, scales, global_scale)
    if x.shape[-1] != k:
        raise ValueError(f"nvfp4_linear: x of shape {tuple(x.shape)} does not match a weight [{n}, {k}]")
    if x.is_cuda and x.dtype in (torch.float16, torch.bfloat16):
        y = fp4_gemm(x.reshape(-1, k), prepared(codes, scales, global_scale), bias)
        return y.reshape(*x.shape[:-1], n)
    return nvfp4_linear_reference(x, codes, scales, global_scale, bias)


@nvfp4_linear.register_fake
def _(x, codes, scales, global_scale, bias=None):
    return x.new_empty((*x.shape[:-1], codes.shape[0]))


@torch.library.custom_op("qerl_kernels::nvfp4_dequantize", mutates_args=())
def nvfp4_dequantize(codes: torch.Tensor, scales: torch.Tensor, global_scale: torch.Tensor,
                     dtype: torch.dtype) -> torch.Tensor:
    """The dense weight [N, K] as `dtype` (Triton on CUDA for float16/bfloat16, torch otherwise)."""
    _check(codes, scales, global_scale)
    if codes.is_cuda and dtype in (torch.float16, torch.bfloat16):
        return fp4_dequantize(prepared(codes, scales, global_scale), dtype)
    return nvfp4_dequantize_reference(codes, scales, global_scale, dtype)


@nvfp4_dequantize.register_fake
def _(codes, scales, global_scale, dtype):
    return codes.new_empty((codes.shape[0], codes.shape[1] * 2), dtype=dtype)


@torch.library.custom_op("qerl_kernels::nvfp4_linear_grad_input", mutates_args=())
def nvfp4_linear_grad_input(grad_y: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor,
                            global_scale: torch.Tensor) -> torch.Tensor:
    """grad_x = grad_y @ W [..., K] for grad_y [..., N]: fused transposed kernel on CUDA at small M
    (`fp4_launch.fp4_gemm_t`), dequantize + matmul otherwise."""
    n, k = _check(codes, scales, global_scale)
    if grad_y.is_cuda and grad_y.dtype in (torch.float16, torch.bfloat16):
        g = fp4_gemm_t(grad_y.reshape(-1, n), prepared(codes, scales, global_scale))
        return g.reshape(*grad_y.shape[:-1], k)
    return grad_y @ nvfp4_dequantize_reference(codes, scales, global_scale, grad_y.dtype)


@nvfp4_linear_grad_input.register_fake
def _(grad_y, codes, scales, global_scale):
    return grad_y.new_empty((*grad_y.shape[:-1], codes.shape[1] * 2))


def _setup(ctx, inputs, output):
    x, codes, scales, global_scale, bias = inputs
    ctx.save_for_backward(codes, scales, global_scale)
    ctx.has_bias = bias is not None


def _backward(ctx, grad_y):
    codes, scales, global_scale = ctx.saved_tensors
    grad_b = grad_y.reshape(-1, grad_y.shape[-1]).sum(0) if ctx.has_bias else None
    return nvfp4_linear_grad_input(grad_y, codes, scales, global_scale), None, None, None, grad_b


nvfp4_linear.register_autograd(_backward, setup_context=_setup)
