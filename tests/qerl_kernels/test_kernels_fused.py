"""The decode engine's GEMM entry point `qerl_kernels.fp4_linear_fused`: groups (several weights in one launch:
`concat_prepared`, or `layout.stacked_view` over members that already are consecutive rows of one allocation, no copy)
and the epilogue's LoRA update and residual add match the float32 reference. CPU: TRITON_INTERPRET=1, tiny shapes;
GPU: autotuned kernels, both dtypes."""
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


def _views(ms):
    """The members as row views of one allocation (what QuantLinear layers hold after share_kernel_storage)."""
    cat = layout.concat_prepared(ms)
    return cat, [layout.PreparedFP4(cat.words[row:row + p.words.shape[0]], cat.scales[row:row + p.words.shape[0]],
                                    p.out_scales, p.n, p.k, p.scale_kind) for p, (row, _) in zip(ms, cat.parts)]


def test_stacked_view_is_the_concatenation_without_a_copy():
    ms = _members()
    cat, views = _views(ms)
    sv = layout.stacked_view(views)
    assert sv.parts == cat.parts == ((0, 96), (128, 40), (256, 40)) and sv.n == 296 and sv.k == 128
    assert sv.words.data_ptr() == cat.words.data_ptr() and sv.scales.data_ptr() == cat.scales.data_ptr()
    assert all(torch.equal(getattr(sv, f), getattr(cat, f)) for f in ("words", "scales", "out_scales"))
    assert layout.stacked_view(ms) is None  # separate allocations
    assert layout.stacked_view([views[1], views[0]]) is None  # not in allocation order
    with pytest.raises(ValueError, match="share K"):
        layout.stacked_view([ms[0], qerl_kernels.random_prepared("nvfp4", 32, 256, seed=9, device=DEV)[0]])


@pytest.mark.triton_device
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
@pytest.mark.parametrize("m", [1, 5] + ([40, 200] if CUDA else []), ids=lambda m: f"M{m}")
def test_group_matches_its_members_reference(dtype, fmt, m):
    ms = _members(fmt)
    cat, views = _views(ms)
    x = torch.randn(m, 128, device=DEV).to(dtype)
    a = fp4_launch.fp4_gemm(x, cat, path="swap")
    assert a.shape == (m, 296)
    assert torch.equal(fp4_launch.fp4_gemm(x, layout.stacked_view(views), path="swap"), a)
    assert torch.equal(qerl_kernels.fp4_linear_fused(x[:3], cat), fp4_launch.fp4_gemm(x[:3], cat))
    ref = torch.cat([x.float() @ layout.dequantize_prepared_reference(p).t() for p in ms], 1)
    for (row, n), (r0, n0) in zip(cat.parts, zip((0, 96, 136), (96, 40, 40))):  # the padding rows hold zeros
        assert rel_error(a[:, row:row + n], ref[:, r0:r0 + n0]) < 6e-3


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
    grp = layout.concat_prepared(ms)
    x = torch.randn(2, 64)
    y = qerl_kernels.fp4_linear_fused(x, grp, use_triton=False)
    ref = torch.cat([x @ layout.dequantize_prepared_reference(ms[0]).t(), torch.zeros(2, 64),
                     x @ layout.dequantize_prepared_reference(ms[1]).t()], 1)
    assert torch.allclose(y, ref[:, :168], atol=1e-5)
    with pytest.raises(ValueError, match="does not match"):
        qerl_kernels.fp4_linear_fused(torch.randn(2, 32), grp)


# ---------------------------------------------------------------------------------------------------------------
# the tensor-core tiles (M >= 64): forward with every epilogue option, groups, backward
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
def test_tensor_core_group_lora_residual(dtype):
    ms = _members()
    x = torch.randn(70, 128, device=DEV).to(dtype)
    grp = layout.concat_prepared(ms)
    assert rel_error(fp4_launch.fp4_gemm(x, grp, path="tc"),
                     qerl_kernels.prepared_ops.fp4_linear_fused_reference(x.float(), grp)) < 6e-3
    p, dense, _ = qerl_kernels.random_prepared("nvfp4", 200, 256, seed=5, device=DEV)
    x = torch.randn(70, 256, device=DEV).to(dtype)
    t, lb = torch.randn(70, 16, device=DEV).to(dtype), (0.1 * torch.randn(200, 16, device=DEV)).to(dtype)
    h = torch.randn(70, 200, device=DEV).to(dtype)
    out = fp4_launch.fp4_gemm(x, p, lora=(t, lb), residual=h, path="tc")
    ref = x.float() @ dense.t().float() + t.float() @ lb.float().t() + h.float()
    assert rel_error(out, ref) < 6e-3
    with pytest.raises(ValueError, match="backward takes a single weight"):
        fp4_launch.fp4_gemm_tc(torch.randn(70, 296, device=DEV).to(dtype), layout.concat_prepared(ms), forward=False)
