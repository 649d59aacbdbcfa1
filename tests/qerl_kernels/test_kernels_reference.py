"""The kernels' torch reference (the format spec, qerl.formats) and their load-time layout: bit-exact round trips."""
import pytest
import torch

from qerl_kernels import reference as R
from qerl_kernels.layout import e4m3_to_e5m3, prepare_codes, unprepare_codes


@pytest.mark.parametrize("n,k", [(3, 32), (130, 160), (128, 256)], ids=["tiny", "padded", "aligned"])
def test_prepare_codes_roundtrip(n, k):
    codes = torch.randint(0, 256, (n, k // 2), dtype=torch.uint8)
    words = prepare_codes(codes)
    assert words.dtype == torch.int32 and words.shape == (-(-n // 128) * 128, -(-k // 128) * 16)
    assert torch.equal(unprepare_codes(words, n, k), codes)


def test_e5m3_exact_for_every_e4m3():
    e4m3 = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn)
    v = e4m3.float()
    keep = torch.isfinite(v) & (v >= 0)
    q = e4m3_to_e5m3(e4m3[keep]).int()
    decoded = 2.0 ** ((q >> 3) - 10).float() * (1 + (q & 7).float() / 8)
    assert torch.equal(torch.where(v[keep] > 0, decoded, torch.zeros(1)), v[keep])


def test_quantizers_roundtrip_representable_values():
    # MXFP4: values that E2M1 represents survive quantize -> dequantize unchanged
    g = torch.Generator().manual_seed(0)
    vals = torch.tensor(R.E2M1_VALUES[:8])
    w = vals[torch.randint(0, 8, (4, 64), generator=g)] * torch.sign(torch.randn(4, 64, generator=g))
    codes, scales = R.mxfp4_quantize_reference(w)
    assert torch.equal(R.mxfp4_dequantize_reference(codes, scales), w)
    # NVFP4 rounds block scales to E4M3, so only check the 4-bit error bound: half the widest step (6 -> 4 levels) of
    # the block's scale amax / 6, which E4M3's rounding may raise by half its unit in the last place (2**-4). On 3000
    # random 4 x 64 inputs the error reached 1.056x amax / 6 (a bound of 1.01x, before, failed on 506 of them)
    for _ in range(20):
        x = torch.randn(4, 64, generator=g)
        codes, scales, gs = R.nvfp4_quantize_reference(x)
        err = (R.nvfp4_dequantize_reference(codes, scales, gs) - x).abs().reshape(4, 4, 16).amax(-1)
        assert (err <= x.abs().reshape(4, 4, 16).amax(-1) / 6 * (1 + 2 ** -4) + 1e-6).all()
