"""The one entry point through which every 4-bit linear layer computes: `w4a16_linear`.

Why one function: QuantLinear, the measurement scripts and the RL loop all call it, so the Triton W4A16 kernels
(qerl_kernels/, written separately) plug in at exactly one place. On CUDA with fp16/bf16 activations the forward runs
the fused dequantize-GEMM kernel and the backward the fused transposed kernel at small M, dequantize + cuBLAS at
large M (qerl_kernels.fp4_linear / fp4_linear_grad_input); otherwise it dequantizes the packed weight with the torch
reference (qerl.formats) and calls F.linear. `w4a16_linear_prepared` is the same computation for a weight held only
in the kernels' layout (QuantLinear after `prepare_kernels`, or a fused q/k/v group from qerl_kernels.concat_prepared).

Autograd: the frozen 4-bit weight gets no gradient; the input gradient is grad_y @ W_dequant, recomputed from the
packed weight in backward (nothing of weight size is saved between forward and backward, which is what saves memory
during LoRA training). A bias that requires grad gets grad_y summed over the leading dimensions. A caller that keeps
the dequantized weight itself (QuantLinear does for small layers: `QuantLinear.dense_weight`) passes it as `dense` on
the CPU, and both passes use it instead of dequantizing: the same tensor, so the same numbers. The two exceptions to
"every 4-bit product goes through here": on CUDA a small QuantLinear computes calls above
qerl_kernels' `dequantize_only_above()` rows as F.linear with that kept weight, which is the kernels' only path at
those rows (dequantize + cuBLAS) without the custom op around it; on the CPU without autograd (rollouts, log-prob and
evaluation passes) it computes F.linear with its kept weight, this function's own product without the
autograd.Function around it (~10 % of a tiny-scale NVFP4 rollout on a 2-core Xeon). Works under
torch.compile (dynamo traces the autograd.Function) and under gradient checkpointing (forward is a pure function of
its inputs).

`w4a16_linear_reference` is the plain-torch specification (dequantize + F.linear, autograd through torch) that the
entry point and, later, the kernels are tested against.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from qerl.formats import mxfp4, nvfp4

__all__ = ["FORMAT_NAMES", "dequantize_weight", "w4a16_linear", "w4a16_linear_prepared", "w4a16_linear_reference"]

FORMAT_NAMES = ("nvfp4", "mxfp4")


def dequantize_weight(codes: torch.Tensor, scales: torch.Tensor, global_scale: torch.Tensor | None, fmt: str,
                      dtype: torch.dtype) -> torch.Tensor:
    """The dense weight [N, K] of packed `codes` [N, K // 2] in `fmt`, as `dtype`.

    Args:
        codes: uint8 [N, K // 2], two E2M1 codes per byte.
        scales: float8_e4m3fn [N, K // 16] (nvfp4) or uint8 E8M0 [N, K // 32] (mxfp4).
        global_scale: float32 0-dim dequantization multiplier (nvfp4); None for mxfp4.
        fmt: "nvfp4" or "mxfp4".
        dtype: output dtype.

    Returns:
        Tensor [N, K].

    Raises:
        ValueError: unknown `fmt`.
    """
    if fmt == "nvfp4":
        return nvfp4.dequantize_tensors(codes, scales, global_scale, dtype)
    if fmt == "mxfp4":
        return mxfp4.dequantize_tensors(codes, scales, dtype)
    raise ValueError(f"unknown 4-bit format {fmt!r}; known: {list(FORMAT_NAMES)}")


def _use_kernels(t: torch.Tensor) -> bool:
    return t.is_cuda and t.dtype in (torch.float16, torch.bfloat16)


class _W4A16Linear(torch.autograd.Function):
    """y = x @ W^T + b with W packed; grad_x = grad_y @ W; no gradient for W."""

    @staticmethod
    def forward(ctx, x, codes, scales, global_scale, bias, fmt, dense):
        ctx.save_for_backward(codes, scales, global_scale, dense)
        ctx.fmt = fmt
        ctx.has_bias = bias is not None
        if _use_kernels(x):  # Triton W4A16 kernels (qerl_kernels/): fused dequantize-GEMM, fp32 accumulation
            from qerl_kernels import fp4_linear
            return fp4_linear(x, codes, scales, global_scale, bias, fmt)
        w = _dense_or_dequantize(dense, codes, scales, global_scale, fmt, x.dtype)
        return F.linear(x, w, bias)

    @staticmethod
    def backward(ctx, grad_y):
        codes, scales, global_scale, dense = ctx.saved_tensors
        grad_x = grad_b = None
        if ctx.needs_input_grad[0]:
            if _use_kernels(grad_y):  # fused transposed kernel (small M) or dequantize kernel + cuBLAS
                from qerl_kernels import fp4_linear_grad_input
                grad_x = fp4_linear_grad_input(grad_y, codes, scales, global_scale, ctx.fmt)
            else:
                w = _dense_or_dequantize(dense, codes, scales, global_scale, ctx.fmt, grad_y.dtype)
                grad_x = grad_y @ w  # [..., N] @ [N, K] -> [..., K]
        if ctx.has_bias and ctx.needs_input_grad[4]:
            grad_b = grad_y.reshape(-1, grad_y.shape[-1]).sum(0)
        return grad_x, None, None, None, grad_b, None, None


def _dense_or_dequantize(dense, codes, scales, global_scale, fmt: str, dtype: torch.dtype) -> torch.Tensor:
    """The caller's dequantized weight when it is in `dtype`, else the packed weight dequantized now."""
    if dense is not None and dense.dtype == dtype:
        return dense
    return dequantize_weight(codes, scales, global_scale, fmt, dtype)


def w4a16_linear(x: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor, global_scale: torch.Tensor | None = None,
                 bias: torch.Tensor | None = None, *, fmt: str, dense: torch.Tensor | None = None) -> torch.Tensor:
    """y = x @ dequant(W)^T + bias, with a 4-bit packed weight W [N, K] and activations in x's dtype.

    Args:
        x: activations [..., K] (float32, bfloat16 or float16).
        codes: uint8 [N, K // 2].
        scales: float8_e4m3fn [N, K // 16] (nvfp4) or uint8 [N, K // 32] (mxfp4).
        global_scale: float32 0-dim (nvfp4 only).
        bias: optional [N], in x's dtype.
        fmt: "nvfp4" or "mxfp4".
        dense: the weight already dequantized (dequantize_weight of these tensors), used off the Triton path
            instead of dequantizing again when its dtype is x's; None: dequantize on each call.

    Returns:
        [..., N] in x's dtype.

    Raises:
        ValueError: unknown `fmt`, or x's last dimension differs from the weight's K.
    """
    if fmt not in FORMAT_NAMES:
        raise ValueError(f"unknown 4-bit format {fmt!r}; known: {list(FORMAT_NAMES)}")
    if x.shape[-1] != codes.shape[-1] * 2:
        raise ValueError(
            f"w4a16_linear: input of shape {tuple(x.shape)} does not match a weight of shape "
            f"({codes.shape[0]}, {codes.shape[-1] * 2})"
        )
    return _W4A16Linear.apply(x, codes, scales, global_scale, bias, fmt, dense)


def w4a16_linear_prepared(x: torch.Tensor, prepared, bias: torch.Tensor | None = None) -> torch.Tensor:
    """y = x @ W^T + bias for a weight held in the kernels' layout (qerl_kernels.PreparedFP4, single or a group).

    CUDA fp16/bf16 activations run the Triton kernels (backward: fused transposed kernel / dequantize + cuBLAS);
    anything else the plain-torch reference of the prepared form (float32 math, output in x's dtype). Autograd gives
    the input gradient and, when the bias requires it, the bias gradient; the weight gets none.

    Raises:
        ValueError: x's last dimension differs from the weight's K.
    """
    from qerl_kernels import fp4_prepared_linear
    return fp4_prepared_linear(x, prepared, bias)


def w4a16_linear_reference(x: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor,
                           global_scale: torch.Tensor | None = None, bias: torch.Tensor | None = None, *,
                           fmt: str) -> torch.Tensor:
    """Plain-torch specification of w4a16_linear: dequantize, then F.linear (autograd through torch)."""
    return F.linear(x, dequantize_weight(codes, scales, global_scale, fmt, x.dtype), bias)
