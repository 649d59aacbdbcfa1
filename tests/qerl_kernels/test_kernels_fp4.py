"""Triton FP4 kernels against the torch reference.

CPU (TRITON_INTERPRET=1, set by tests/conftest.py when there is no GPU): tiny shapes, fixed configs that
exercise padding, stream-K partial tiles and the tiled path; the interpreter uses the pure-Triton decoder.
GPU: random shapes through the autotuned kernels (inline-PTX decoder) and the torch.library ops.
"""
import functools

import pytest
import torch

triton = pytest.importorskip("triton")

import qerl_kernels  # noqa: E402
from qerl_kernels import fp4_launch, layout, mxfp4, nvfp4  # noqa: E402
from qerl_kernels import reference as R  # noqa: E402

CUDA = torch.cuda.is_available()
INTERP = layout.interpret_mode()
DEV = "cuda" if CUDA else "cpu"


_weight = functools.partial(qerl_kernels.random_prepared, device=DEV)
_rel = R.rel_error


def _tol(dtype):
    # one rounding of the fp32 result to the output dtype (bf16: 2**-8), plus summation-order noise
    return 4e-3 if dtype == torch.bfloat16 else 1e-3


@pytest.mark.triton_device
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_dequantize_kernel_exact(fmt, dtype):
    prepared, ref_w, _ = _weight(fmt, 80, 160, seed=1)  # rows and columns both padded
    out = fp4_launch.fp4_dequantize(prepared, dtype)
    if INTERP and dtype == torch.bfloat16:
        # the interpreter's own float32 -> bfloat16 cast rounds half-up; compare within one bf16 step
        assert torch.allclose(out.float(), ref_w, rtol=2 ** -7, atol=0)
    else:
        assert torch.equal(out, ref_w.to(dtype))


CPU_CONFIGS = {
    "streamk": dict(STREAM_K=True, BM=16, BN=64, BK=128, GROUP_M=1, CPS=3, num_warps=4, num_stages=1),
    "streamk_bk256": dict(STREAM_K=True, BM=16, BN=64, BK=256, GROUP_M=1, CPS=2, num_warps=4, num_stages=1),
    "tiled": dict(STREAM_K=False, BM=16, BN=64, BK=128, GROUP_M=2, CPS=1, num_warps=4, num_stages=1),
}


@pytest.mark.triton_device
@pytest.mark.parametrize("cfg", list(CPU_CONFIGS), ids=list(CPU_CONFIGS))
@pytest.mark.parametrize("fmt,dtype,m,bias", [
    ("nvfp4", torch.float16, 3, False), ("nvfp4", torch.bfloat16, 20, True),
    ("mxfp4", torch.float16, 20, True), ("mxfp4", torch.bfloat16, 1, False)],
    ids=["nv-fp16-m3", "nv-bf16-m20-bias", "mx-fp16-m20-bias", "mx-bf16-m1"])
def test_gemm_fixed_configs(cfg, fmt, dtype, m, bias):
    torch.manual_seed(m)
    prepared, ref_w, _ = _weight(fmt, 96, 512, seed=m)      # 2 row tiles x 4 k-steps: partial tiles on 2+ CTAs
    x = torch.randn(m, 512, device=DEV).to(dtype)
    b = torch.randn(96, device=DEV).to(dtype) if bias else None
    y = fp4_launch.fp4_gemm(x, prepared, b, config=CPU_CONFIGS[cfg], fused=True)
    ref = R._linear(x, ref_w, b)
    assert y.shape == (m, 96) and y.dtype == dtype
    assert torch.isfinite(y).all()
    assert _rel(y, ref) < _tol(dtype)


def test_ops_cpu_path_is_the_reference():
    codes, scales, gs = R.nvfp4_quantize_reference(torch.randn(32, 64))
    x = torch.randn(2, 5, 64, requires_grad=True)
    y = nvfp4.nvfp4_linear(x, codes, scales, gs)
    assert torch.equal(y, R.nvfp4_linear_reference(x.detach(), codes, scales, gs))
    y.sum().backward()
    w = R.nvfp4_dequantize_reference(codes, scales, gs)
    assert torch.allclose(x.grad, torch.ones(2, 5, 32) @ w, atol=1e-5)
    c2, s2 = R.mxfp4_quantize_reference(torch.randn(32, 64))
    assert torch.equal(mxfp4.mxfp4_dequantize(c2, s2, torch.float32), R.mxfp4_dequantize_reference(c2, s2))
    assert torch.equal(mxfp4.mxfp4_linear(x.detach(), c2, s2), R.mxfp4_linear_reference(x.detach(), c2, s2))


def test_shape_errors_name_the_shapes():
    codes, scales, gs = R.nvfp4_quantize_reference(torch.randn(32, 64))
    with pytest.raises(ValueError, match=r"\(3, 48\)"):
        nvfp4.nvfp4_linear(torch.randn(3, 48), codes, scales, gs)
    with pytest.raises(ValueError, match="scales must be"):
        nvfp4.prepare(codes, scales[:, :2], gs)


# ---------------------------------------------------------------------------------------------------------------
# GPU: autotuned kernels on random shapes
# ---------------------------------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_gpu_random_shapes(fmt, dtype):
    gen = torch.Generator().manual_seed(1234)
    for trial in range(3):
        n = int(torch.randint(1, 40, (1,), generator=gen)) * 32
        k = int(torch.randint(1, 20, (1,), generator=gen)) * 256
        prepared, ref_w, raw = _weight(fmt, n, k, seed=trial)
        for m in (1, 16, 40, 300):
            x = torch.randn(m, k, device="cuda", dtype=dtype)
            bias = torch.randn(n, device="cuda", dtype=dtype) if trial % 2 else None
            y = fp4_launch.fp4_gemm(x, prepared, bias, fused=True)
            ref = R._linear(x, ref_w, bias)
            assert _rel(y, ref) < _tol(dtype), (fmt, dtype, n, k, m)
        assert torch.equal(fp4_launch.fp4_dequantize(prepared, dtype), ref_w.to(dtype))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_gpu_asm_decoder_matches_pure_triton(dtype):
    prepared, ref_w, _ = _weight("nvfp4", 256, 1024, seed=5)
    x = torch.randn(16, 1024, device="cuda", dtype=dtype)
    cfg = dict(STREAM_K=True, BM=16, BN=64, BK=128, GROUP_M=1, CPS=2, num_warps=4, num_stages=3)
    y_asm = fp4_launch.fp4_gemm(x, prepared, config=cfg, fused=True)
    fp4_launch.USE_ASM_OVERRIDE = False
    try:
        y_pure = fp4_launch.fp4_gemm(x, prepared, config=cfg, fused=True)
    finally:
        fp4_launch.USE_ASM_OVERRIDE = None
    assert _rel(y_asm, y_pure) < 1e-3


@pytest.mark.gpu
def test_gpu_ops_autograd_and_compile():
    codes, scales, gs = R.nvfp4_quantize_reference(torch.randn(256, 512))
    codes, scales, gs = codes.cuda(), scales.cuda(), gs.cuda()
    x = torch.randn(4, 3, 512, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    y = nvfp4.nvfp4_linear(x, codes, scales, gs)
    y.float().square().sum().backward()
    w = R.nvfp4_dequantize_reference(codes, scales, gs)
    ref_x = x.detach().clone().requires_grad_(True)
    (ref_x.float() @ w.t()).square().sum().backward()
    assert _rel(x.grad, ref_x.grad) < 2e-2
    f = torch.compile(lambda t: nvfp4.nvfp4_linear(t, codes, scales, gs), fullgraph=True)
    assert _rel(f(x.detach()), y.detach()) < 1e-6


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
def test_gpu_w4a16_linear_entry_point(fmt):
    ops = pytest.importorskip("qerl.layers.ops")
    w = torch.randn(384, 512)
    if fmt == "nvfp4":
        codes, scales, gs = (t.cuda() for t in R.nvfp4_quantize_reference(w))
    else:
        (codes, scales), gs = (t.cuda() for t in R.mxfp4_quantize_reference(w)), None
    bias = torch.randn(384, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    for m in (3, 200):
        x = torch.randn(m, 512, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        y = ops.w4a16_linear(x, codes, scales, gs, bias, fmt=fmt)
        g = torch.randn_like(y)
        y.backward(g)
        x_ref = x.detach().clone().requires_grad_(True)
        b_ref = bias.detach().clone().requires_grad_(True)
        y_ref = ops.w4a16_linear_reference(x_ref, codes, scales, gs, b_ref, fmt=fmt)
        y_ref.backward(g)
        assert _rel(y, y_ref) < 1e-2 and _rel(x.grad, x_ref.grad) < 1e-2 and _rel(bias.grad, b_ref.grad) < 1e-3
        bias.grad = None
