"""The skinny-M kernel (qerl_kernels/fp4_gemv.py) against the dequantize-then-matmul reference, and its dispatch.

CPU (TRITON_INTERPRET=1, set by tests/conftest.py when there is no GPU): the offline sm_90 compile check of three
of the heuristic's 7B launches (fresh process, no interpreter); tiny shapes (N = 81 rows: odd, padded to
128; K at the format's block multiple, ragged against the 128-column chunk, or whole k-steps), both modes (FMA for
M <= 4, tensor-core DOT above), split-K on and off, bias, a group; the interpreter runs the pure-Triton decoder.
GPU: the compiled kernel (inline-PTX decoder) on random and 7B shapes, bit-for-bit repeatability of the split-K
reduction, and the dispatch through a measured-table entry.
"""
import functools

import pytest
import torch

triton = pytest.importorskip("triton")

import qerl_kernels  # noqa: E402
from qerl_kernels import fp4_gemv, fp4_launch, layout  # noqa: E402
from tests.qerl_kernels.bounds import check_w4a16_close  # noqa: E402

CUDA = torch.cuda.is_available()
INTERP = layout.interpret_mode()
DEV = "cuda" if CUDA else "cpu"
N = 81

_weight = functools.partial(qerl_kernels.random_prepared, device=DEV)


def _check_close(y, x, dense, bias=None):
    """y against x @ dense^T (+ bias) in float32 (tests/qerl_kernels/bounds.py's bound)."""
    ref = x.float() @ dense.t() + (bias.float() if bias is not None else 0)
    check_w4a16_close(y, ref, x.float().abs() @ dense.abs().t())


# (M, K for nvfp4 / mxfp4, knobs): FMA and DOT modes, split-K off (SPLIT 1) and on (one slice per k-step), K
# ragged (400 / 416: the last k-step passes K and K_pad) or whole k-steps (512). BN 16 and BW 16 each appear with
# another knob at 32: the interpreter's time grows with the programs launched (BN 16 with BW 16 and SPLIT 4 ran
# 32 programs for 128 padded rows, 2-4 s a case in the suite; BN 32 runs 16)
CASES = {
    "m1-fma-ragged-split": (1, (400, 416), dict(DOT=False, BN=32, BW=16, SPLIT=4)),
    "m1-fma-nosplit": (1, (512, 512), dict(DOT=False, BN=16, BW=32, SPLIT=1)),
    "m3-fma-split": (3, (512, 512), dict(DOT=False, BN=32, BW=16, SPLIT=4)),
    "m3-dot-ragged": (3, (400, 416), dict(DOT=True, BN=32, BW=16, SPLIT=2)),
    "m16-dot-split": (16, (512, 512), dict(DOT=True, BN=32, BW=16, SPLIT=4)),
    "m16-dot-nosplit-ragged": (16, (400, 416), dict(DOT=True, BN=64, BW=32, SPLIT=1)),
}


@pytest.mark.triton_device
@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
@pytest.mark.parametrize("fmt,dtype,bias", [("nvfp4", torch.bfloat16, True), ("nvfp4", torch.float16, False),
                                            ("mxfp4", torch.bfloat16, False), ("mxfp4", torch.float16, True)],
                         ids=["nv-bf16-bias", "nv-fp16", "mx-bf16", "mx-fp16-bias"])
def test_gemv_matches_reference(case, fmt, dtype, bias):
    m, ks, cfg = CASES[case]
    k = ks[0] if fmt == "nvfp4" else ks[1]
    p, dense, _ = _weight(fmt, N, k, seed=m + k)
    gen = torch.Generator().manual_seed(m)
    x = torch.randn(m, k, generator=gen).to(DEV, dtype)
    b = torch.randn(N, generator=gen).to(DEV, dtype) if bias else None
    y = fp4_gemv.fp4_gemm_gemv(x, p, b, config=cfg)
    assert y.shape == (m, N) and y.dtype == dtype
    _check_close(y, x, dense, b)


@pytest.mark.triton_device
def test_gemv_default_knobs_and_a_group():
    """The heuristic's own knobs (FMA at M 1-4, DOT above), and a concat_prepared group whose members carry very
    different per-tensor scales (one factor per row)."""
    parts = [_weight("nvfp4", n, 256, seed=20 + i, scale=s) for i, (n, s) in enumerate(((40, 1.0), (24, 5e-3)))]
    grp = layout.concat_prepared([p for p, _, _ in parts])
    dense = torch.zeros(grp.n, 256, device=DEV)
    dense[:40], dense[128:] = parts[0][1], parts[1][1]
    for m in (2, 7):
        x = torch.randn(m, 256, device=DEV).to(torch.bfloat16)
        _check_close(fp4_gemv.fp4_gemm_gemv(x, grp), x, dense)


def test_m_bucket_and_split_heuristic():
    assert [fp4_gemv.m_bucket(m) for m in (1, 2, 4, 5, 8, 9, 16)] == [1, 4, 4, 8, 8, 16, 16]
    c = fp4_gemv.gemv_config(1, 18944, 3584 // 8, 132)
    assert not c["DOT"] and (c["BN"], c["BW"], c["SPLIT"]) == (32, 64, 2)
    c = fp4_gemv.gemv_config(1, 3584, 18944 // 8, 132)
    assert c["SPLIT"] == 8                                        # 37 k-steps: 8 slices of 5
    assert fp4_gemv.gemv_config(16, 3584, 448, 132)["DOT"]


@pytest.mark.triton_device
def test_gemv_rejects_what_it_does_not_do():
    p, _, _ = _weight("nvfp4", 32, 128, seed=1)
    with pytest.raises(ValueError, match="M = 17"):
        fp4_gemv.fp4_gemm_gemv(torch.zeros(17, 128, device=DEV, dtype=torch.float16), p)
    with pytest.raises(ValueError, match="FMA mode"):
        fp4_gemv.fp4_gemm_gemv(torch.zeros(5, 128, device=DEV, dtype=torch.float16), p, config=dict(DOT=False))


@pytest.mark.triton_device
def test_dispatch_is_off_by_default_and_follows_the_switch(monkeypatch):
    p, dense, _ = _weight("mxfp4", 48, 128, seed=2)
    x = torch.randn(2, 128, device=DEV).to(torch.float16)
    calls = []
    real = fp4_gemv.fp4_gemm_gemv
    monkeypatch.setattr(fp4_gemv, "fp4_gemm_gemv", lambda *a, **k: calls.append(k) or real(*a, **k))
    monkeypatch.delenv("QERL_FP4_GEMV", raising=False)
    monkeypatch.setattr(fp4_gemv, "MEASURED_WINS", {})
    fp4_launch.fp4_gemm(x, p)
    assert calls == []                                            # no measured entry: the default is unchanged
    monkeypatch.setenv("QERL_FP4_GEMV", "1")
    _check_close(fp4_launch.fp4_gemm(x, p), x, dense)
    assert len(calls) == 1
    lora = (torch.zeros(2, 16, device=DEV, dtype=torch.float16), torch.zeros(48, 16, device=DEV, dtype=torch.float16))
    fp4_launch.fp4_gemm(x, p, lora=lora)                          # an epilogue the kernel lacks: stream-K kernel
    fp4_launch.fp4_gemm(x, p, fused=True)                         # a forced path wins
    fp4_launch.fp4_gemm(torch.randn(17, 128, device=DEV).to(torch.float16), p)
    assert len(calls) == 1
    monkeypatch.setenv("QERL_FP4_GEMV", "0")
    fp4_launch.fp4_gemm(x, p)
    assert len(calls) == 1


def test_compiles_for_sm90_without_spills(offline_build):
    """`python -m qerl_kernels.fp4_gemv`: the launcher's own arguments (launch_args) -> TTGIR -> PTX -> cubin for
    sm_90 with the bundled ptxas, in a fresh process without TRITON_INTERPRET (the interpreter, once it has run a
    kernel in a process, leaves triton.language patched for itself). On a GPU the tests below run the real thing."""
    if CUDA:
        pytest.skip("on a GPU the compiled kernel itself is tested")
    names = ["gate-m1", "gate-m4", "down-m16"]
    r, out = offline_build("qerl_kernels.fp4_gemv", "--only", *names)
    rows = {row["name"]: row for row in out}
    assert r.returncode == 0 and set(rows) == set(names), (r.stdout, r.stderr[-3000:])
    for row in rows.values():
        assert row["status"] == "ok" and row["spill_st"] == 0 and row["regs"] <= 128, row   # >= 4 CTAs of 4 warps
    assert rows["gate-m1"]["grid"] == [592, 2] and not rows["gate-m1"]["DOT"] and rows["down-m16"]["DOT"]


# ---------------------------------------------------------------------------------------------------------------
# GPU: the compiled kernel
# ---------------------------------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_gpu_gemv_random_shapes(fmt, dtype):
    gen = torch.Generator().manual_seed(4321)
    for trial in range(3):
        n = int(torch.randint(1, 60, (1,), generator=gen)) * 16 + 3
        k = int(torch.randint(1, 40, (1,), generator=gen)) * 32
        p, dense, _ = _weight(fmt, n, k, seed=trial)
        bias = torch.randn(n, device="cuda", dtype=dtype) if trial % 2 else None
        for m in (1, 2, 3, 4, 5, 8, 16):
            x = torch.randn(m, k, device="cuda", dtype=dtype)
            _check_close(fp4_gemv.fp4_gemm_gemv(x, p, bias), x, dense, bias)


@pytest.mark.gpu
@pytest.mark.parametrize("n,k", [(18944, 3584), (3584, 18944), (512, 3584)], ids=["gate", "down", "kv"])
def test_gpu_gemv_7b_shapes_and_repeatable(n, k):
    p, dense, _ = _weight("nvfp4", n, k, seed=3)
    for m in (1, 4, 16):
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        y = fp4_gemv.fp4_gemm_gemv(x, p)
        _check_close(y, x, dense)
        for _ in range(3):  # the split-K reduction sums in slice order: the same bits every time
            assert torch.equal(fp4_gemv.fp4_gemm_gemv(x, p), y)


@pytest.mark.gpu
def test_gpu_dispatch_takes_a_measured_entry(monkeypatch):
    p, dense, _ = _weight("nvfp4", 256, 512, seed=4)
    x = torch.randn(3, 512, device="cuda", dtype=torch.bfloat16)
    monkeypatch.delenv("QERL_FP4_GEMV", raising=False)
    key = (fp4_gemv._device_key(torch.cuda.current_device()), 0, "bf16", 256, 512, 4)
    monkeypatch.setitem(fp4_gemv.MEASURED_WINS, key, dict(BN=16, BW=16))
    assert fp4_gemv.selected(x, p) == dict(BN=16, BW=16)
    assert fp4_gemv.selected(x[:1], p) is None                     # M bucket 1: not in the table
    _check_close(fp4_launch.fp4_gemm(x, p), x, dense)
