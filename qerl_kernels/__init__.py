"""Triton W4A16 kernels for NVFP4 and MXFP4, their torch references and benchmarks.

Public API (CUDA tensors run the Triton kernels, CPU tensors the torch reference):
    fp4_linear(x, codes, scales, global_scale, bias, fmt)      y = x @ W^T + bias, W in the storage layout
    fp4_linear_grad_input(grad_y, codes, scales, global_scale, fmt)   grad_y @ W (fused kernel at small M)
    fp4_launch.fp4_gemm_tc(a, p, forward=...)                 tensor-core tiles for M >= 64 (opt-in, see fp4_launch)
    fp4_gluon.fp4_gemm_gluon(x, p, bias)                      Gluon warp-specialized kernel, NVFP4, M <= 64, Hopper
                                                              (benchmarked, not in the default dispatch; issue 22)
    fp4_wgmma.fp4_gemm_wgmma(x, p, bias)                      Gluon async-wgmma kernel (register-A decode), NVFP4,
                                                              M 16-512, Hopper (a timed candidate of the default
                                                              dispatch for M 65-512; issue 22)
    fp4_gemv.fp4_gemm_gemv(x, p, bias)                        skinny-M split-K kernel, NVFP4/MXFP4, M <= 16 (in the
                                                              default dispatch only where measured; issue 22)
    fp4_dequantize_weight(codes, scales, global_scale, fmt, dtype)
    prepare(codes, scales, global_scale, fmt) -> PreparedFP4   the kernels' layout, once per weight
    concat_prepared([p_q, p_k, p_v]) -> group                  several weights of one K as one launch
    fp4_prepared_linear(x, p, bias) / fp4_linear_grouped(x, group, bias) / group_bias(group, biases)
    fp4_linear_fused(x, w, bias, lora=(t, B), residual=h)       inference: base + LoRA + residual in one launch
    decode.*            the fused decode-step kernels (RMSNorm, the split LoRA down-products with or without the
                        norm, RoPE + KV write, split-K attention, SiLU-mul, the sampler)
    l2_prefetch.l2_prefetch(t)                                PTX L2 prefetch of a tensor (a probe: calls 24-26)
    nvfp4.* / mxfp4.*   per-format ops (torch.ops.qerl_kernels.*), prepare() for the kernel layout
    reference.*         the plain-torch specification, taken from qerl.formats (the format spec)
How the kernels work: layout.py (the load-time weight layout and its torch references), fp4_decoder.py (the
E2M1 decoder), fp4_triton.py (the Triton kernels), fp4_tuning.py (their autotuning), fp4_launch.py (launchers and
dispatch by M), fp4_gluon.py (the Gluon kernel and its launcher), fp4_wgmma.py (the wgmma kernel), fp4_gemv.py (the
skinny-M kernel); bench.py for how they are measured (bench_lora.py for the decode step's LoRA down-products,
bench_rope.py for the batch-1 RoPE + cache paths),
kernels.notes.md for what each GPU call measured; gluon_compile.py and decode_compile.py build the Gluon GEMMs'
and the decode step's launches for sm_90 on a CPU machine (registers, spills, SASS).
"""
from __future__ import annotations

import torch

from qerl_kernels import decode, mxfp4, nvfp4, reference
from qerl_kernels.layout import PreparedFP4, concat_prepared, dequantize_prepared_reference
from qerl_kernels.prepared_ops import fp4_linear_fused, fp4_linear_grouped, fp4_prepared_linear, group_bias

__all__ = ["fp4_linear", "fp4_linear_grad_input", "fp4_dequantize_weight", "prepare", "PreparedFP4",
           "concat_prepared", "dequantize_prepared_reference", "fp4_prepared_linear", "fp4_linear_grouped",
           "group_bias", "random_prepared", "nvfp4", "mxfp4", "reference", "fp4_linear_fused",
           "decode"]


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


def fp4_linear_grad_input(grad_y: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor,
                          global_scale: torch.Tensor | None, fmt: str) -> torch.Tensor:
    """grad_x = grad_y @ W for a packed 4-bit weight W [N, K]; grad_y [..., N] -> [..., K]."""
    if fmt == "nvfp4":
        return nvfp4.nvfp4_linear_grad_input(grad_y, codes, scales, global_scale)
    if fmt == "mxfp4":
        return mxfp4.mxfp4_linear_grad_input(grad_y, codes, scales)
    raise ValueError(f"unknown 4-bit format {fmt!r}; known: ['nvfp4', 'mxfp4']")


def prepare(codes: torch.Tensor, scales: torch.Tensor, global_scale: torch.Tensor | None, fmt: str) -> PreparedFP4:
    """The kernels' layout of a packed weight (nvfp4.prepare / mxfp4.prepare), on the codes' device."""
    if fmt == "nvfp4":
        return nvfp4.prepare(codes, scales, global_scale)
    if fmt == "mxfp4":
        return mxfp4.prepare(codes, scales)
    raise ValueError(f"unknown 4-bit format {fmt!r}; known: ['nvfp4', 'mxfp4']")


def random_prepared(fmt: str, n: int, k: int, seed: int, *, scale: float = 1.0, device="cpu"):
    """reference.random_quantized's seeded random weight, also in the kernels' layout: (prepared, dense, raw)."""
    raw, dense = reference.random_quantized(fmt, n, k, seed, scale=scale, device=device)
    return (nvfp4 if fmt == "nvfp4" else mxfp4).prepare(*raw), dense, raw
