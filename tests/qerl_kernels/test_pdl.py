"""Programmatic dependent launch (qerl_kernels.pdl): when it is on, and that a chain of dependent decode kernels
launched with it gives the same bits as without, eagerly and replayed in a CUDA graph (GPU)."""
import pytest
import torch

triton = pytest.importorskip("triton")

import qerl_kernels  # noqa: E402
from qerl_kernels import decode, fp4_launch, pdl  # noqa: E402

CUDA = torch.cuda.is_available()


def test_off_on_cpu_and_by_switch(monkeypatch):
    monkeypatch.setenv("QERL_PDL", "1")
    assert not pdl.enabled(torch.zeros(1)) and pdl.launch_kw(torch.zeros(1)) == {}
    if CUDA:
        monkeypatch.delenv("QERL_PDL")  # off by default (call 59: no faster in the 7B step)
        assert not pdl.enabled(torch.zeros(1, device="cuda"))
        monkeypatch.setenv("QERL_PDL", "0")
        assert not pdl.enabled(torch.zeros(1, device="cuda"))
        monkeypatch.setenv("QERL_PDL", "1")
        on = torch.cuda.get_device_capability()[0] >= 9 and pdl.HAVE_GDC
        assert pdl.enabled(torch.zeros(1, device="cuda")) == on
        assert pdl.launch_kw(torch.zeros(1, device="cuda")) == ({"PDL": True, "launch_pdl": True} if on else {})


def _chain(h, norm_w, a_qkv, w_qkv, w_o, lora_b):
    """norm + LoRA down-products -> a 4-bit GEMM -> another with LoRA and residual -> norm: each kernel reads the
    one before it."""
    x, t = decode.rmsnorm_lora(h, norm_w, 1e-6, a_qkv, use_triton=True)
    y = fp4_launch.fp4_gemm(x, w_qkv)
    out = fp4_launch.fp4_gemm(y[:, :w_o.k].contiguous(), w_o, lora=(t[:, :lora_b.shape[1]].contiguous(), lora_b),
                              residual=h)
    return decode.rmsnorm(out, norm_w, 1e-6, use_triton=True)


@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
def test_dependent_chain_same_bits_with_and_without(monkeypatch):
    if not (torch.cuda.get_device_capability()[0] >= 9 and pdl.HAVE_GDC):
        pytest.skip("PDL needs compute capability 9.0+")
    gen = torch.Generator().manual_seed(0)
    hid, r = 512, 16
    h = torch.randn(1, hid, generator=gen).cuda().bfloat16()
    norm_w = (1 + 0.1 * torch.randn(hid, generator=gen)).cuda().bfloat16()
    a_qkv = (0.05 * torch.randn(3 * r, hid, generator=gen)).cuda().bfloat16()
    w_qkv, _, _ = qerl_kernels.random_prepared("nvfp4", 3 * hid, hid, seed=1, device="cuda")
    w_o, _, _ = qerl_kernels.random_prepared("nvfp4", hid, hid, seed=2, device="cuda")
    lora_b = (0.05 * torch.randn(w_o.words.shape[0], r, generator=gen)).cuda().bfloat16()
    outs = {}
    for mode in ("0", "1"):
        monkeypatch.setenv("QERL_PDL", mode)
        eager = _chain(h, norm_w, a_qkv, w_qkv, w_o, lora_b)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            graphed = _chain(h, norm_w, a_qkv, w_qkv, w_o, lora_b)
        for _ in range(3):
            g.replay()
        torch.cuda.synchronize()
        assert torch.equal(graphed, eager)
        outs[mode] = eager
    assert torch.equal(outs["0"], outs["1"])
