"""Iteration 2 of the FP4 kernels: the fused backward kernel, q/k/v-style groups, ops over prepared tensors and
QuantLinear holding only the prepared form.

CPU (TRITON_INTERPRET=1, set by tests/conftest.py when there is no GPU): tiny shapes and fixed configs through
the interpreter; the storage tests need no Triton at all. GPU: the autotuned kernels on random shapes.
"""
import functools

import pytest
import torch
from torch import nn

triton = pytest.importorskip("triton")

import qerl_kernels  # noqa: E402
from qerl_kernels import fp4_launch, layout, mxfp4, nvfp4  # noqa: E402
from qerl_kernels import reference as R  # noqa: E402

CUDA = torch.cuda.is_available()
INTERP = layout.interpret_mode()
DEV = "cuda" if CUDA else "cpu"
T_CFG = {"one": dict(BM=16, BKO=128, BNR=64, SPLIT_X=1, num_warps=4, num_stages=1),
         "split": dict(BM=16, BKO=128, BNR=64, SPLIT_X=4, num_warps=4, num_stages=1)}


_quant = functools.partial(qerl_kernels.random_prepared, device=DEV)
_rel = R.rel_error


def _tol(dtype):
    # against the unrounded float32 reference: one rounding to the output dtype (bf16 2**-9 relative per element)
    # plus summation order; the interpreter's own float32 -> bf16 casts add about one more bf16 rounding
    if dtype == torch.bfloat16:
        return 6e-3 if INTERP else 4e-3
    return 1e-3


# ---------------------------------------------------------------------------------------------------------------
# layout inverses and the torch reference of the prepared form (no Triton kernels)
# ---------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
def test_unprepare_and_prepared_reference_are_exact(fmt):
    p, ref_w, raw = _quant(fmt, 70, 96, seed=3)                   # rows and columns padded
    assert torch.equal(layout.dequantize_prepared_reference(p), ref_w)
    back = (nvfp4 if fmt == "nvfp4" else mxfp4).unprepare(p)
    for a, b in zip(back, raw):
        assert a.shape == b.shape and a.dtype == b.dtype
        assert torch.equal(a.view(torch.uint8) if a.dtype == torch.float8_e4m3fn else a,
                           b.view(torch.uint8) if b.dtype == torch.float8_e4m3fn else b)


def test_concat_prepared_keeps_each_members_scale():
    p1, r1, _ = _quant("nvfp4", 96, 128, seed=1, scale=1e-3)
    p2, r2, _ = _quant("nvfp4", 40, 128, seed=2, scale=10.0)    # very different per-tensor scales
    grp = layout.concat_prepared([p1, p2])
    assert grp.parts == ((0, 96), (128, 40)) and grp.n == 168 and grp.row_scale
    full = layout.dequantize_prepared_reference(grp)
    assert torch.equal(full[:96], r1) and torch.equal(full[128:], r2) and not full[96:128].any()
    with pytest.raises(ValueError, match="share K"):
        layout.concat_prepared([p1, _quant("nvfp4", 32, 256, seed=3)[0]])


def test_prepared_op_cpu_path_and_autograd():
    p, ref_w, _ = _quant("nvfp4", 48, 64, seed=4, device="cpu")
    x = torch.randn(2, 3, 64, requires_grad=True)
    b = torch.randn(48, requires_grad=True)
    y = qerl_kernels.fp4_prepared_linear(x, p, b)
    assert torch.allclose(y, x.detach() @ ref_w.t() + b.detach(), atol=1e-5)
    g = torch.randn_like(y)
    y.backward(g)
    assert torch.allclose(x.grad, g @ ref_w, atol=1e-5) and torch.allclose(b.grad, g.sum((0, 1)), atol=1e-5)
    with pytest.raises(ValueError, match=r"\(2, 32\)"):
        qerl_kernels.fp4_prepared_linear(torch.randn(2, 32), p)


# ---------------------------------------------------------------------------------------------------------------
# kernels: fused transposed (backward) kernel and groups
# ---------------------------------------------------------------------------------------------------------------
@pytest.mark.triton_device
@pytest.mark.parametrize("cfg", list(T_CFG), ids=list(T_CFG))
@pytest.mark.parametrize("fmt,dtype,m", [("nvfp4", torch.float16, 3), ("nvfp4", torch.bfloat16, 17),
                                         ("mxfp4", torch.bfloat16, 1), ("mxfp4", torch.float16, 5)],
                         ids=["nv-fp16-m3", "nv-bf16-m17", "mx-bf16-m1", "mx-fp16-m5"])
def test_backward_kernel_fixed_configs(cfg, fmt, dtype, m):
    p, ref_w, _ = _quant(fmt, 200, 256, seed=m)                 # 2 row blocks of 128 (+ padding): splits over rows
    g = torch.randn(m, 200, device=DEV).to(dtype)
    out = fp4_launch.fp4_gemm_t(g, p, config=T_CFG[cfg] if not CUDA else None, fused=True)
    assert out.shape == (m, 256) and out.dtype == dtype and torch.isfinite(out).all()
    assert _rel(out, g.float() @ ref_w) < _tol(dtype)


@pytest.mark.triton_device
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_group_forward_and_backward_match_the_members(dtype):
    parts = [_quant("nvfp4", n, 128, seed=10 + i, scale=s) for i, (n, s) in enumerate(((64, 1.0), (32, 3e-3),
                                                                                         (160, 30.0)))]
    grp = qerl_kernels.concat_prepared([p for p, _, _ in parts])
    biases = [torch.randn(64, device=DEV).to(dtype), None, torch.randn(160, device=DEV).to(dtype)]
    bias = qerl_kernels.group_bias(grp, biases)
    x = torch.randn(5, 128, device=DEV).to(dtype).requires_grad_(True)
    outs = qerl_kernels.fp4_linear_grouped(x, grp, bias)
    assert [o.shape[-1] for o in outs] == [64, 32, 160]
    grads = [torch.randn_like(o) for o in outs]
    torch.autograd.backward(outs, grads)
    ref_gx = torch.zeros(5, 128, device=DEV)
    for (p, ref_w, _), o, b, g in zip(parts, outs, biases, grads):
        ref = x.detach().float() @ ref_w.t() + (b.float() if b is not None else 0)
        assert _rel(o, ref) < _tol(dtype)
        ref_gx += g.float() @ ref_w
    assert _rel(x.grad, ref_gx) < _tol(dtype)


# ---------------------------------------------------------------------------------------------------------------
# QuantLinear: only the prepared form on the device
# ---------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
def test_quant_linear_keeps_only_the_prepared_form(fmt):
    layers = pytest.importorskip("qerl.layers")
    torch.manual_seed(0)
    q = layers.QuantLinear.from_linear(nn.Linear(256, 128, bias=True), fmt)
    state = {k: v.clone() for k, v in q.state_dict().items()}
    x = torch.randn(3, 256)
    y = q(x)
    assert q.prepare_kernels() is True and q.is_prepared
    assert "codes" not in q._buffers and "scale_bits" not in q._buffers
    held = sum(b.numel() * b.element_size() for n, b in q.named_buffers() if n.startswith("w4_"))
    bits = {"nvfp4": 4.5, "mxfp4": 4.25}[fmt]
    assert held == 128 * 256 * bits / 8 + 2 * 128 * 4           # + the per-row factors
    assert torch.equal(q(x), y)                                    # CPU forward: derived storage, same numbers
    assert torch.equal(q.codes, state["codes"]) and torch.equal(q.scale_bits, state["scale_bits"])
    sd = q.state_dict()
    assert sd.keys() == state.keys() and all(torch.equal(sd[k], state[k]) for k in state)
    fresh = layers.QuantLinear(256, 128, bias=True, fmt=fmt)
    fresh.prepare_kernels()
    fresh.load_state_dict(state)
    assert fresh.is_prepared and torch.equal(fresh(x), y)
    q.to(torch.bfloat16)
    assert q.compute_dtype == torch.bfloat16 and q.w4_out_scales_bits.dtype == torch.int32
    q.unprepare_kernels()
    assert not q.is_prepared and torch.equal(q.codes, state["codes"])


def test_quant_linear_keeps_codes_it_cannot_rederive():
    layers = pytest.importorskip("qerl.layers")
    q = layers.QuantLinear.from_linear(nn.Linear(64, 32, bias=False), "nvfp4")
    q.scale_bits[0, 0] = 0                                         # a zero-scale block ...
    q.codes[0, 0] = 0x31                                           # ... with non-zero codes: prepare zeroes them
    codes = q.codes.clone()
    assert q.prepare_kernels() is False and q.is_prepared
    assert torch.equal(q.codes, codes) and torch.equal(q.state_dict()["codes"], codes)


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
def test_gpu_quant_linear_prepared_forward_backward(fmt):
    layers = pytest.importorskip("qerl.layers")
    torch.manual_seed(0)
    q = layers.QuantLinear.from_linear(nn.Linear(512, 384, bias=True), fmt).cuda().to(torch.bfloat16)
    w = q.weight.float()
    for m in (1, 16, 100):
        x = torch.randn(m, 512, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        y = q(x)
        assert q.is_prepared and "codes" not in q._buffers
        g = torch.randn_like(y)
        y.backward(g)
        ref = x.detach().float() @ w.t() + q.bias.float()
        assert _rel(y, ref) < 4e-3 and _rel(x.grad, g.float() @ w) < 4e-3


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_gpu_backward_random_shapes(fmt, dtype):
    gen = torch.Generator().manual_seed(99)
    for trial in range(3):
        n = int(torch.randint(1, 40, (1,), generator=gen)) * 32
        k = int(torch.randint(1, 20, (1,), generator=gen)) * 256
        p, ref_w, _ = _quant(fmt, n, k, seed=trial)
        for m in (1, 16, 40, 300):
            g = torch.randn(m, n, device="cuda", dtype=dtype)
            out = fp4_launch.fp4_gemm_t(g, p, fused=m <= 64 or None)
            assert torch.isfinite(out).all() and _rel(out, g.float() @ ref_w) < _tol(dtype), (fmt, dtype, n, k, m)
