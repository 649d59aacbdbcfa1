"""The decode engine's GEMM entry point `qerl_kernels.fp4_linear_fused`: segmented groups (several weights in one
launch, no copy: `segment_prepared`) equal `concat_prepared` bit for bit, and the epilogue's LoRA update and residual add
match the float32 reference. CPU: TRITON_INTERPRET=1, tiny shapes; GPU: autotuned kernels, both dtypes."""
import pytest
import torch

triton = pytest.importorskip("triton")

import qerl_kernels  # noqa: E402
from qerl_kernels import fp4_launch, layout  # noqa: E402
from qerl_kernels.reference import rel_error  # noqa: E402

CUDA = torch.cuda.is_available()
DEV = "cuda" if CUDA else "cpu"
DTYPES = [torch.bfloat16] + ([torch.float16] if CUDA else [])


def _members(fmt="nvfp4", rows=(96, 40, 40), k=128):
    return [qerl_kernels.random_prepared(fmt, n, k, seed=i, scale=10.0 ** (i - 1), device=DEV)[0]
            for i, n in enumerate(rows)]


def test_segment_table_and_errors():
    ms = _members()
    seg = qerl_kernels.segment_prepared(ms)
    assert seg.parts == ((0, 96), (128, 40), (256, 40)) and seg.n == 296 and seg.k == 128
    assert tuple(seg.table.shape) == (2, 3, 3) and seg.table.dtype == torch.int64
    assert seg.nbytes == sum(p.nbytes for p in ms)  # no copy
    with pytest.raises(ValueError, match="share K"):
        qerl_kernels.segment_prepared([ms[0], qerl_kernels.random_prepared("nvfp4", 32, 256, seed=9, device=DEV)[0]])


@pytest.mark.triton_device
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
@pytest.mark.parametrize("m", [1, 5] + ([40, 200] if CUDA else []), ids=lambda m: f"M{m}")
def test_segmented_equals_concatenated(dtype, fmt, m):
    ms = _members(fmt)
    seg, cat = qerl_kernels.segment_prepared(ms), layout.concat_prepared(ms)
    x = torch.randn(m, 128, device=DEV).to(dtype)
    path = "swap" if m <= 512 else "deq"  # the same kernel for both (the default dispatch times each on its own)
    a, b = fp4_launch.fp4_gemm(x, seg, path=path), fp4_launch.fp4_gemm(x, cat, path=path)
    assert a.shape == b.shape == (m, 296)
    assert torch.equal(a, b)
    assert torch.equal(qerl_kernels.fp4_linear_fused(x[:3], seg), qerl_kernels.fp4_linear_fused(x[:3], cat))
    ref = qerl_kernels.prepared_ops.fp4_linear_fused_reference(x.float(), seg)
    assert rel_error(a, ref) < 6e-3


@pytest.mark.triton_device
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("parts", ["lora", "residual", "bias+lora+residual"])
@pytest.mark.parametrize("m", [3] + ([64, 300] if CUDA else []), ids=lambda m: f"M{m}")
def test_lora_and_residual_epilogue(dtype, parts, m):
    p, dense, _ = qerl_kernels.random_prepared("nvfp4", 200, 256, seed=5, device=DEV)
    g = torch.Generator().manual_seed(m)
    x = torch.randn(m, 256, generator=g).to(DEV, dtype)
    t = torch.randn(m, 32, generator=g).to(DEV, dtype) if "lora" in parts else None
    lb = (0.1 * torch.randn(200, 32, generator=g)).to(DEV, dtype) if "lora" in parts else None
    h = torch.randn(m, 200, generator=g).to(DEV, dtype) if "residual" in parts else None
    b = torch.randn(200, generator=g).to(DEV, dtype) if "bias" in parts else None
    lora = (t, lb) if t is not None else None
    out = qerl_kernels.fp4_linear_fused(x, p, b, lora=lora, residual=h)
    ref = x.float() @ dense.t().float()
    for extra in (b, None if t is None else t.float() @ lb.float().t(), h):
        if extra is not None:
            ref = ref + extra.float()
    assert rel_error(out, ref) < 6e-3
    if CUDA:  # the dequantize + cuBLAS path (large M) applies the same extras
        slow = fp4_launch.fp4_gemm(x, p, b, fused=False, lora=lora, residual=h)
        assert rel_error(slow, ref) < 6e-3


def test_fused_cpu_reference_path():
    ms = [qerl_kernels.random_prepared("nvfp4", n, 64, seed=i, device="cpu")[0] for i, n in enumerate((64, 40))]
    seg = qerl_kernels.segment_prepared(ms)
    x = torch.randn(2, 64)
    y = qerl_kernels.fp4_linear_fused(x, seg, use_triton=False)
    ref = torch.cat([x @ layout.dequantize_prepared_reference(ms[0]).t(), torch.zeros(2, 64),
                     x @ layout.dequantize_prepared_reference(ms[1]).t()], 1)
    assert torch.allclose(y, ref[:, :168], atol=1e-5)
    with pytest.raises(ValueError, match="does not match"):
        qerl_kernels.fp4_linear_fused(torch.randn(2, 32), seg)


# ---------------------------------------------------------------------------------------------------------------
# the tensor-core tiles (M >= 64): forward with every epilogue option, segmented groups, backward
# ---------------------------------------------------------------------------------------------------------------
TC_M = [70] + ([256, 1000] if CUDA else [])


@pytest.mark.triton_device
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
@pytest.mark.parametrize("m", TC_M, ids=lambda m: f"M{m}")
def test_tensor_core_forward_and_backward(dtype, fmt, m):
    p, dense, _ = qerl_kernels.random_prepared(fmt, 200, 256, seed=7, device=DEV)
    g = torch.Generator().manual_seed(m)
    x = torch.randn(m, 256, generator=g).to(DEV, dtype)
    b = torch.randn(200, generator=g).to(DEV, dtype)
    y = fp4_launch.fp4_gemm(x, p, b, path="tc")
    assert rel_error(y, x.float() @ dense.t().float() + b.float()) < 6e-3
    gy = torch.randn(m, 200, generator=g).to(DEV, dtype)
    gx = fp4_launch.fp4_gemm_t(gy, p, path="tc")
    assert gx.shape == (m, 256) and rel_error(gx, gy.float() @ dense.float()) < 6e-3


@pytest.mark.triton_device
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_tensor_core_segmented_lora_residual(dtype):
    ms = _members()
    seg = qerl_kernels.segment_prepared(ms)
    x = torch.randn(70, 128, device=DEV).to(dtype)
    assert torch.equal(fp4_launch.fp4_gemm(x, seg, path="tc"),
                       fp4_launch.fp4_gemm(x, layout.concat_prepared(ms), path="tc"))
    p, dense, _ = qerl_kernels.random_prepared("nvfp4", 200, 256, seed=5, device=DEV)
    x = torch.randn(70, 256, device=DEV).to(dtype)
    t, lb = torch.randn(70, 16, device=DEV).to(dtype), (0.1 * torch.randn(200, 16, device=DEV)).to(dtype)
    h = torch.randn(70, 200, device=DEV).to(dtype)
    out = fp4_launch.fp4_gemm(x, p, lora=(t, lb), residual=h, path="tc")
    ref = x.float() @ dense.t().float() + t.float() @ lb.float().t() + h.float()
    assert rel_error(out, ref) < 6e-3
    with pytest.raises(ValueError, match="backward takes a single weight"):
        fp4_launch.fp4_gemm_tc(torch.randn(70, 296, device=DEV).to(dtype), layout.concat_prepared(ms), forward=False)
