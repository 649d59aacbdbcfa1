"""NVFP4 / MXFP4 / E2M1: the specification tests, and agreement with torch's own dtypes and reference.

torch (2.13, CPU) offers float8_e4m3fn and float8_e8m0fnu conversions, and the float4_e2m1fn_x2 dtype without a
conversion kernel (none on CUDA either: torch 2.11+cu130 on an H200 refuses float -> float4_e2m1fn_x2 and asserts on
the way back); for E2M1 rounding and packing we compare against torch's vendored port of torchao's MX/NVFP4
quantizers (torch/_vendor/quack/mx_utils.py), loaded by file path because its package imports CUDA bindings.
The same quantizers run bit-identically on CUDA (checked once on an H200: codes, scales and dequantized values of
both formats equal the CPU ones; QuantLinear forward/backward match the reference there).
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from qerl.formats import BITS_PER_WEIGHT, dequantize, fp4, mxfp4, nvfp4, quantize

E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]
FORMATS = [pytest.param(nvfp4, id="nvfp4"), pytest.param(mxfp4, id="mxfp4")]


def _torch_mx_utils():
    path = Path(torch.__file__).parent / "_vendor" / "quack" / "mx_utils.py"
    if not path.exists():
        pytest.skip(f"torch {torch.__version__} ships no {path.name} reference")
    spec = importlib.util.spec_from_file_location("_torch_vendored_mx_utils", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# ---------------------------------------------------------------- E2M1 element
def test_all_16_codes_decode_to_the_e2m1_values():
    codes = torch.arange(16, dtype=torch.uint8)
    vals = fp4.e2m1_decode(codes)
    assert vals[:8].tolist() == E2M1
    assert vals[8:].tolist() == [-v for v in E2M1]
    assert torch.signbit(vals[8])  # code 8 is -0


def test_all_16_codes_roundtrip_through_encode():
    vals = fp4.e2m1_decode(torch.arange(16, dtype=torch.uint8))
    assert fp4.e2m1_encode_reference(vals).tolist() == list(range(16))


def test_nibble_bit_layout():
    # bit 3 sign, bits 2-1 exponent (bias 1), bit 0 mantissa
    for code in range(16):
        sign, exp, man = code >> 3, (code >> 1) & 3, code & 1
        value = (0.5 * man) if exp == 0 else 2.0 ** (exp - 1) * (1 + 0.5 * man)
        assert fp4.e2m1_decode(torch.tensor([code], dtype=torch.uint8)).item() == (-value if sign else value)


@pytest.mark.parametrize(
    "x, code",
    [(0.25, 0), (0.75, 2), (1.25, 2), (1.75, 4), (2.5, 4), (3.5, 6), (5.0, 6),  # ties go to the even code
     (0.2501, 1), (0.7499, 1), (2.51, 5), (4.99, 6), (5.01, 7), (7.0, 7), (1e9, 7),  # nearest / saturation
     (-0.25, 8), (-0.75, 10), (-5.0, 14), (-100.0, 15), (-0.0, 8), (0.0, 0)],
    ids=lambda v: repr(v),
)
def test_round_to_nearest_even(x, code):
    assert fp4.e2m1_encode_reference(torch.tensor([x])).item() == code


def test_encode_matches_torch_reference_on_a_dense_sweep():
    mx = _torch_mx_utils()
    x = torch.linspace(-8, 8, 6401)  # step 1/400 hits every midpoint exactly
    ours = fp4.e2m1_encode_reference(x)
    theirs = mx._f32_to_floatx_unpacked(x.clone(), 2, 1)
    assert torch.equal(ours, theirs)


def test_packing_low_nibble_first_matches_float4_e2m1fn_x2():
    codes = torch.tensor([[1, 2, 3, 4, 15, 8]], dtype=torch.uint8)
    packed = fp4.pack_nibbles(codes)
    assert packed.tolist() == [[0x21, 0x43, 0x8F]]
    assert torch.equal(fp4.unpack_nibbles(packed), codes)
    # torch's packed fp4 dtype is a byte holding two codes; torch's packer puts element 2j in the low nibble too
    as_torch = packed.view(torch.float4_e2m1fn_x2)
    assert as_torch.shape == packed.shape and torch.equal(as_torch.view(torch.uint8), packed)
    assert torch.equal(_torch_mx_utils()._pack_uint4(codes), packed)


# ---------------------------------------------------------------- round trips
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("shape", [(32,), (4, 64), (2, 3, 96)], ids=["1d", "2d", "3d"])
def test_layout_shapes_and_dtypes(fmt, shape):
    w = torch.randn(shape)
    p = fmt.quantize(w)
    k = shape[-1]
    assert p.codes.shape == (*shape[:-1], k // 2) and p.codes.dtype == torch.uint8
    assert p.scales.shape == (*shape[:-1], k // fmt.BLOCK_SIZE)
    assert p.scales.dtype == (torch.float8_e4m3fn if fmt is nvfp4 else torch.uint8)
    assert fmt.dequantize(p).shape == w.shape and fmt.dequantize(p).dtype == w.dtype


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=["fp32", "bf16", "fp16"])
def test_representable_values_roundtrip_exactly(fmt, dtype):
    # a block holding every E2M1 magnitude (max 6) at a power-of-two scale is exactly representable in both formats
    torch.manual_seed(0)
    vals = torch.tensor(E2M1 + [-v for v in E2M1])
    w = torch.stack([vals[torch.randperm(16)].repeat(2) * 2.0 ** e for e in (-3, 0, 4)]).to(dtype)
    if fmt is nvfp4:
        w = w[:1]  # one tensor-wide amax -> every block scale exactly 448 / 448
    out = fmt.dequantize(fmt.quantize(w))
    if fmt is mxfp4:
        assert torch.equal(out, w)
    else:  # amax / 2688 is not a power of two: exact up to FP32 rounding of the global scale
        torch.testing.assert_close(out, w, rtol=1e-6, atol=0)


@pytest.mark.parametrize("fmt, max_rel_err", [(nvfp4, 0.11), (mxfp4, 0.14)], ids=["nvfp4", "mxfp4"])
def test_gaussian_error_is_what_4_bits_give(fmt, max_rel_err):
    torch.manual_seed(0)
    w = torch.randn(64, 256)
    err = (fmt.dequantize(fmt.quantize(w)) - w).norm() / w.norm()
    assert 0.05 < err < max_rel_err


def test_nvfp4_block_scales_use_e4m3_range_and_global_scale_is_amax_over_2688():
    torch.manual_seed(0)
    w = torch.randn(8, 64) * 3
    p = nvfp4.quantize(w)
    assert p.global_scale.dim() == 0 and p.global_scale.dtype == torch.float32
    assert torch.isclose(p.global_scale, w.abs().max() / (448 * 6))
    assert p.scales.float().max() == 448  # the block holding amax uses E4M3's top value


def test_nvfp4_scales_agree_with_torch_float8_e4m3fn_cast():
    torch.manual_seed(1)
    w = torch.randn(16, 128) * torch.logspace(-3, 3, 16)[:, None]
    p = nvfp4.quantize(w)
    exact = w.reshape(16, 8, 16).abs().amax(-1) / 6 / p.global_scale
    assert torch.equal(p.scales.view(torch.uint8), exact.to(torch.float8_e4m3fn).view(torch.uint8))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_nvfp4_agrees_bitwise_with_torch_reference(seed):
    mx = _torch_mx_utils()
    torch.manual_seed(seed)
    w = torch.randn(32, 128)
    p = nvfp4.quantize(w)
    codes, scales, gs = mx.to_nvfp4(w, per_tensor_scale=mx.nvfp4_per_tensor_scale(w.abs().max()))
    assert torch.equal(p.scales.view(torch.uint8), scales.view(torch.uint8))
    assert torch.equal(p.codes, codes.view(torch.uint8))
    assert torch.equal(p.global_scale, gs)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_mxfp4_agrees_bitwise_with_torch_reference_and_e8m0fnu(seed):
    mx = _torch_mx_utils()
    torch.manual_seed(seed)
    w = torch.randn(32, 128) * torch.logspace(-4, 4, 32)[:, None]
    p = mxfp4.quantize(w)
    codes, scales = mx.to_mxfp4(w)
    assert torch.equal(p.codes, codes)
    assert torch.equal(p.scales, scales.view(torch.uint8))
    # the uint8 scale is bit-identical to torch.float8_e8m0fnu of the power-of-two scale
    as_e8m0 = p.scales.view(torch.float8_e8m0fnu).float()
    assert torch.equal(as_e8m0, torch.ldexp(torch.ones(p.scales.shape), p.scales.float() - 127))
    assert torch.equal(as_e8m0.to(torch.float8_e8m0fnu).view(torch.uint8), p.scales)


def test_mxfp4_shared_exponent_is_floor_log2_amax_minus_2():
    amax = torch.tensor([1.0, 1.99, 2.0, 6.0, 7.99, 8.0, 0.75, 2.0**-130, 0.0, 3e38])
    expected = [-2, -2, -1, 0, 0, 1, -3, -127, -127, 125]
    assert (mxfp4.shared_exponent(amax).int() - 127).tolist() == expected


def test_mxfp4_block_amax_in_6_to_8_saturates_to_6():
    w = torch.zeros(32)
    w[0], w[1] = 7.0, 1.0
    out = mxfp4.dequantize(mxfp4.quantize(w))
    assert out[0] == 6.0 and out[1] == 1.0


# ---------------------------------------------------------------- edge cases
@pytest.mark.parametrize("fmt", FORMATS)
def test_all_zero_tensor_and_blocks(fmt):
    w = torch.zeros(4, 64)
    p = fmt.quantize(w)
    assert torch.equal(fmt.dequantize(p), w) and int(p.codes.max()) == 0
    w[0, :16] = torch.randn(16)  # one non-zero block, the rest stay exactly zero
    out = fmt.dequantize(fmt.quantize(w))
    assert torch.isfinite(out).all() and torch.equal(out[1:], w[1:])


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("magnitude", [1e-30, 1e-6, 1e6, 1e30, 3e38], ids=lambda m: f"{m:g}")
def test_tiny_and_huge_tensors_keep_relative_accuracy(fmt, magnitude):
    torch.manual_seed(0)
    w = torch.randn(4, 64)
    w = w / w.abs().max() * magnitude
    out = fmt.dequantize(fmt.quantize(w))
    assert torch.isfinite(out).all()
    w64, out64 = w.double() / magnitude, out.double() / magnitude  # norms of 1e38-sized values overflow FP32
    assert (out64 - w64).norm() / w64.norm() < 0.2


def test_nvfp4_tiny_block_beside_huge_block_underflows_to_zero_not_nan():
    w = torch.ones(2, 16)
    w[0] *= 1e30
    w[1] *= 1e20  # 1e10 below the largest block: below E4M3's range after the global scale
    out = nvfp4.dequantize(nvfp4.quantize(w))
    assert torch.isfinite(out).all() and torch.equal(out[0], w[0]) and (out[1] == 0).all()


def test_mxfp4_tiny_block_beside_huge_block_is_exact():
    w = torch.ones(2, 32)
    w[0] *= 2.0**100
    w[1] *= 2.0**-100  # per-block power-of-two scales: no interaction between blocks
    assert torch.equal(mxfp4.dequantize(mxfp4.quantize(w)), w)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")], ids=["nan", "inf", "-inf"])
def test_non_finite_input_is_rejected(fmt, bad):
    w = torch.randn(2, 64)
    w[1, 3] = bad
    with pytest.raises(ValueError, match=r"non-finite.*NaN or Inf"):
        fmt.quantize(w)


@pytest.mark.parametrize("fmt", FORMATS)
def test_last_dim_not_divisible_is_rejected_naming_the_shape(fmt):
    with pytest.raises(ValueError, match=r"\(3, 40\).*not divisible by the block size"):
        fmt.quantize(torch.randn(3, 40))


def test_non_float_and_0d_inputs_are_rejected():
    with pytest.raises(ValueError, match="floating-point"):
        nvfp4.quantize(torch.ones(2, 16, dtype=torch.int32))
    with pytest.raises(ValueError, match="0-dim"):
        mxfp4.quantize(torch.tensor(1.0))


def test_dispatch_and_bits_per_weight():
    w = torch.randn(64, 128)
    for name in ("nvfp4", "mxfp4"):
        p = quantize(w, name)
        assert dequantize(p).shape == w.shape
        assert p.nbytes * 8 / w.numel() == pytest.approx(BITS_PER_WEIGHT[name], abs=0.01)
    with pytest.raises(ValueError, match="unknown 4-bit format"):
        quantize(w, "int4")
