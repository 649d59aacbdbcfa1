"""torch.library ops over weights already in the kernels' layout (PreparedFP4), single or grouped.

Why: a layer that keeps only the prepared form (QuantLinear after `prepare_kernels`) and a fused q/k/v or gate/up
group (`concat_prepared`) both compute from the prepared tensors, with no storage-layout codes left to key a cache
on. These ops take the prepared tensors themselves, so they work under autograd, torch.compile (opaque custom
ops with fake kernels) and CUDA graphs.

API:
    fp4_prepared_linear(x, p, bias=None)        y = x @ W^T (+ bias); backward grad_x = grad_y @ W (fused kernel)
    fp4_linear_grouped(x, group, bias=None)     one launch for a group; returns one view per member
    fp4_linear_fused(x, w, bias, lora=(t, B), residual=h)   inference only (no autograd): y = x W^T + b
                                                + t B^T + h in one launch; w a PreparedFP4 (or a group)
    group_bias(group, biases)                   the group's bias vector from the members' biases (or None)
CUDA fp16/bf16 inputs run the Triton kernels; anything else runs the plain-torch reference
(`layout.dequantize_prepared_reference`, float32 math, output in x's dtype).
"""
from __future__ import annotations

import torch

from qerl_kernels.fp4_launch import fp4_gemm, fp4_gemm_t
from qerl_kernels.layout import PreparedFP4, dequantize_prepared_reference, interpret_mode

__all__ = ["fp4_prepared_linear", "fp4_linear_grouped", "group_bias", "fp4_linear_fused", "fp4_linear_fused_reference"]


def _rebuild(words, scales, out_scales, n: int, k: int, scale_kind: int, parts: list[int]) -> PreparedFP4:
    pairs = tuple((parts[i], parts[i + 1]) for i in range(0, len(parts), 2))
    return PreparedFP4(words, scales, out_scales, n, k, scale_kind, pairs)


def _flat_parts(p: PreparedFP4) -> list[int]:
    return [v for pair in p.parts for v in pair]


def _kernel_ok(t: torch.Tensor) -> bool:
    return t.is_cuda and t.dtype in (torch.float16, torch.bfloat16)


@torch.library.custom_op("qerl_kernels::fp4_prepared_linear", mutates_args=())
def _linear_op(x: torch.Tensor, words: torch.Tensor, scales: torch.Tensor, out_scales: torch.Tensor, n: int, k: int,
               scale_kind: int, parts: list[int], bias: torch.Tensor | None = None) -> torch.Tensor:
    p = _rebuild(words, scales, out_scales, n, k, scale_kind, parts)
    if _kernel_ok(x):
        return fp4_gemm(x.reshape(-1, k), p, bias).reshape(*x.shape[:-1], n)
    y = x.float() @ dequantize_prepared_reference(p).t()
    if bias is not None:
        y = y + bias.float()
    return y.to(x.dtype)


@_linear_op.register_fake
def _(x, words, scales, out_scales, n, k, scale_kind, parts, bias=None):
    return x.new_empty((*x.shape[:-1], n))


@torch.library.custom_op("qerl_kernels::fp4_prepared_linear_grad_input", mutates_args=())
def _grad_input_op(grad_y: torch.Tensor, words: torch.Tensor, scales: torch.Tensor, out_scales: torch.Tensor, n: int,
                   k: int, scale_kind: int, parts: list[int]) -> torch.Tensor:
    p = _rebuild(words, scales, out_scales, n, k, scale_kind, parts)
    if _kernel_ok(grad_y):
        return fp4_gemm_t(grad_y.reshape(-1, n), p).reshape(*grad_y.shape[:-1], k)
    return grad_y @ dequantize_prepared_reference(p, grad_y.dtype)


@_grad_input_op.register_fake
def _(grad_y, words, scales, out_scales, n, k, scale_kind, parts):
    return grad_y.new_empty((*grad_y.shape[:-1], k))


def _setup(ctx, inputs, output):
    x, words, scales, out_scales, n, k, scale_kind, parts, bias = inputs
    ctx.save_for_backward(words, scales, out_scales)
    ctx.meta = (n, k, scale_kind, parts)
    ctx.has_bias = bias is not None


def _backward(ctx, grad_y):
    words, scales, out_scales = ctx.saved_tensors
    grad_x = grad_b = None
    if ctx.needs_input_grad[0]:
        grad_x = _grad_input_op(grad_y, words, scales, out_scales, *ctx.meta)
    if ctx.has_bias and ctx.needs_input_grad[8]:
        grad_b = grad_y.reshape(-1, grad_y.shape[-1]).sum(0)
    return grad_x, None, None, None, None, None, None, None, grad_b


_linear_op.register_autograd(_backward, setup_context=_setup)


def fp4_prepared_linear(x: torch.Tensor, p: PreparedFP4, bias: torch.Tensor | None = None) -> torch.Tensor:
    """y = x @ W^T (+ bias) for a prepared weight (or group), x [..., k]; autograd gives grad_x (and grad_b).

    Raises:
        ValueError: x's last dimension is not the weight's k.
    """
    if x.shape[-1] != p.k:
        raise ValueError(f"fp4_prepared_linear: x of shape {tuple(x.shape)} does not match a weight [{p.n}, {p.k}]")
    return _linear_op(x, p.words, p.scales, p.out_scales, p.n, p.k, p.scale_kind, _flat_parts(p), bias)


def group_bias(group: PreparedFP4, biases) -> torch.Tensor | None:
    """The bias vector [group.n] of a group from its members' biases (None entries are zeros; all None -> None)."""
    biases = list(biases)
    if len(biases) != len(group.parts):
        raise ValueError(f"group_bias: {len(biases)} biases for a group of {len(group.parts)} weights")
    if all(b is None for b in biases):
        return None
    ref = next(b for b in biases if b is not None)
    out = torch.zeros(group.n, dtype=ref.dtype, device=ref.device)
    for (row, n), b in zip(group.parts, biases):
        if b is not None:
            out[row:row + n] = b
    return out


def fp4_linear_grouped(x: torch.Tensor, group: PreparedFP4, bias: torch.Tensor | None = None) -> tuple:
    """One launch for a group built by `concat_prepared` (e.g. q/k/v or gate/up); one output view per member.

    Args:
        x: [..., k] activations.
        group: the concatenated prepared weights.
        bias: optional [group.n] (see `group_bias`).

    Returns:
        tuple of [..., n_i] views into one [..., group.n] result, in member order (autograd flows through them).
    """
    y = fp4_prepared_linear(x, group, bias)
    return tuple(y[..., row:row + n] for row, n in group.parts)


def fp4_linear_fused_reference(x: torch.Tensor, w, bias: torch.Tensor | None = None, *, lora: tuple | None = None,
                               residual: torch.Tensor | None = None) -> torch.Tensor:
    """Plain-torch `fp4_linear_fused` (float32 math, one rounding to x's dtype); w a PreparedFP4 or a group."""
    dense = dequantize_prepared_reference(w)
    y = x.float() @ dense.t()
    if bias is not None:
        y = y + bias.float()
    if lora is not None:
        y = y + lora[0].float() @ lora[1][:w.n].float().t()
    if residual is not None:
        y = y + residual.float()
    return y.to(x.dtype)


def fp4_linear_fused(x: torch.Tensor, w, bias: torch.Tensor | None = None, *, lora: tuple | None = None,
                     residual: torch.Tensor | None = None, use_triton: bool | None = None) -> torch.Tensor:
    """y = x @ W^T (+ bias) (+ t @ B^T) (+ residual) for inference (no autograd), one kernel launch on the GPU.

    Args:
        x: [M, k] activations.
        w: PreparedFP4 (single weight or `concat_prepared` group).
        bias: optional [n].
        lora: optional (t [M, R], B [n, R]) for a single weight: the LoRA update, B scaled (R a power of two >= 16).
        residual: optional [M, n] added last.
        use_triton: default: CUDA fp16/bf16 inputs, or the CPU interpreter (TRITON_INTERPRET=1) with fp16/bf16.

    Returns:
        [M, n] in x's dtype.

    Raises:
        ValueError: mismatched shapes (see `fp4_launch.fp4_gemm`).
    """
    if x.shape[-1] != w.k:
        raise ValueError(f"fp4_linear_fused: x of shape {tuple(x.shape)} does not match a weight [{w.n}, {w.k}]")
    if use_triton is None:
        use_triton = x.dtype in (torch.float16, torch.bfloat16) and (x.is_cuda or interpret_mode())
    if not use_triton:
        return fp4_linear_fused_reference(x, w, bias, lora=lora, residual=residual)
    lead = x.shape[:-1]
    x2 = x.reshape(-1, w.k)
    lora2 = None if lora is None else (lora[0].reshape(x2.shape[0], -1), lora[1])
    res2 = None if residual is None else residual.reshape(x2.shape[0], -1)
    return fp4_gemm(x2, w, bias, lora=lora2, residual=res2).reshape(*lead, w.n)
