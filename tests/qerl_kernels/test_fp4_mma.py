"""The decode-size MMA kernel (qerl_kernels/fp4_mma.py) against the dequantize-then-matmul reference, its epilogues
and its dispatch.

CPU (TRITON_INTERPRET=1, set by tests/conftest.py when there is no GPU): the offline sm_90 build of its variants
(fresh process, no interpreter: compiles, no spills, the inline asm on the blocked layout the MMA's lane roles
assume, fewer SASS instructions a word than the skinny-M kernel's FMA mode spends); tiny shapes (N = 81 rows,
padded to 128; K ragged against the 128-column step or whole steps), M 1-8, split-K on and off, bias, LoRA,
residual, a group; the interpreter runs the pure-Triton twin of the asm.
GPU: the compiled kernel on random and 7B shapes, bit-for-bit repeatability of the split-K reduction, the default
dispatch with QERL_FP4_MMA=1.
"""
import functools

import pytest
import torch

triton = pytest.importorskip("triton")

import qerl_kernels  # noqa: E402
from qerl_kernels import fp4_launch, fp4_mma, layout  # noqa: E402
from tests.qerl_kernels.bounds import check_w4a16_close  # noqa: E402

CUDA = torch.cuda.is_available()
DEV = "cuda" if CUDA else "cpu"
N = 81

_weight = functools.partial(qerl_kernels.random_prepared, device=DEV)


# (M, K for nvfp4 / mxfp4, knobs): N = 81 pads to 128 rows; K 400 / 416 (ragged against the 128-column chunk) or
# 512: 4 chunks. CH 1 (a unit = 1 chunk, 32 rows a warp): 4 row blocks (NW 1) x 4 units; CH 2 (the default here:
# 2 chunks, 16 rows a warp): 8 blocks (NW 1) or 4 (NW 2) x 2 units. PER 3: runs that start and end inside row blocks
# (parts reduced across programs, a program with two runs), PER 2: whole blocks, PER 8: several blocks a program;
# NW 1 keeps the interpreter's tensors small (32 lanes)
CASES = {
    "m1-ragged-per3-ch1": (1, (400, 416), dict(NW=1, PER=3, CH=1)),
    "m1-per2-nw2": (1, (512, 512), dict(NW=2, PER=2)),
    "m3-per3": (3, (512, 512), dict(NW=1, PER=3)),
    "m8-ragged-per8": (8, (400, 416), dict(NW=1, PER=8)),
}


# each case with one format / dtype / bias combination (every case and every combination once: the interpreter
# takes 2-4 s a case, the full product ran a minute of the suite)
FORMATS = {"nv-bf16-bias": ("nvfp4", torch.bfloat16, True), "nv-fp16": ("nvfp4", torch.float16, False),
           "mx-bf16": ("mxfp4", torch.bfloat16, False), "mx-fp16-bias": ("mxfp4", torch.float16, True)}


@pytest.mark.triton_device
@pytest.mark.parametrize("case,form", list(zip(CASES, FORMATS)), ids=[f"{c}-{f}" for c, f in zip(CASES, FORMATS)])
def test_mma_matches_reference(case, form):
    fmt, dtype, bias = FORMATS[form]
    m, ks, cfg = CASES[case]
    k = ks[0] if fmt == "nvfp4" else ks[1]
    p, dense, _ = _weight(fmt, N, k, seed=m + k)
    gen = torch.Generator().manual_seed(m)
    x = torch.randn(m, k, generator=gen).to(DEV, dtype)
    b = torch.randn(N, generator=gen).to(DEV, dtype) if bias else None
    y = fp4_mma.fp4_gemm_mma(x, p, b, config=cfg)
    assert y.shape == (m, N) and y.dtype == dtype
    ref = x.float() @ dense.t() + (b.float() if b is not None else 0)
    check_w4a16_close(y, ref, x.float().abs() @ dense.abs().t())


@pytest.mark.triton_device
@pytest.mark.parametrize("m,per", [(1, 3), (5, 16)])
def test_mma_lora_and_residual(m, per):
    """t @ B^T (B with more rows than the weight, as the engine's stacked factors) and the residual stream."""
    k, r = 256, 16
    p, dense, _ = _weight("nvfp4", N, k, seed=7)
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(m, k, generator=gen).to(DEV, torch.bfloat16)
    t = torch.randn(m, r, generator=gen).to(DEV, torch.bfloat16)
    lb = (0.1 * torch.randn(128, r, generator=gen)).to(DEV, torch.bfloat16)
    res = torch.randn(m, N, generator=gen).to(DEV, torch.bfloat16)
    y = fp4_mma.fp4_gemm_mma(x, p, lora=(t, lb), residual=res, config=dict(NW=1, PER=per))
    ref = x.float() @ dense.t() + t.float() @ lb[:N].float().t() + res.float()
    check_w4a16_close(y, ref, x.float().abs() @ dense.abs().t() + res.float().abs())


@pytest.mark.triton_device
def test_mma_group_and_default_knobs():
    """A concat_prepared group whose members carry very different per-tensor scales (one factor a row), with the
    heuristic's own knobs."""
    parts = [_weight("nvfp4", n, 256, seed=20 + i, scale=s) for i, (n, s) in enumerate(((40, 1.0), (24, 5e-3)))]
    grp = layout.concat_prepared([p for p, _, _ in parts])
    dense = torch.zeros(grp.n, 256, device=DEV)
    dense[:40], dense[128:] = parts[0][1], parts[1][1]
    x = torch.randn(2, 256, generator=torch.Generator().manual_seed(0)).to(DEV, torch.bfloat16)
    y = fp4_mma.fp4_gemm_mma(x, grp)
    check_w4a16_close(y, x.float() @ dense.t(), x.float().abs() @ dense.abs().t())


@pytest.mark.triton_device
@pytest.mark.parametrize("nw,ch,per", [(1, 2, 3), (1, 1, 3), (2, 2, 2)])
def test_mma_tiled_weight_same_bits(nw, ch, per):
    """The kernel on `tile_prepared`'s copy (TILED) gives the same bits as on the row-major weight."""
    p, _, _ = _weight("nvfp4", N, 512, seed=5)
    x = torch.randn(2, 512, generator=torch.Generator().manual_seed(4)).to(DEV, torch.bfloat16)
    cfg = dict(NW=nw, CH=ch, PER=per)
    y = fp4_mma.fp4_gemm_mma(x, p, config=cfg)
    yt = fp4_mma.fp4_gemm_mma(x, fp4_mma.tile_prepared(p, nw, ch), config=dict(cfg, TILED=True))
    assert torch.equal(y, yt)
    with pytest.raises(ValueError, match="tile"):
        fp4_mma.tile_prepared(p, 1, 3)


@pytest.mark.skipif(not CUDA, reason="DIRECT changes only how the GPU kernel loads (the interpreter twin has no ring)")
@pytest.mark.parametrize("stages,tiled", [(1, False), (2, True), (3, False)])
def test_mma_direct_loads_same_bits(stages, tiled):
    """The words and scale entries loaded straight into registers (DIRECT, STAGES - 1 units ahead) give the same
    bits as the cp.async ring, across runs that start and end inside row blocks."""
    p, _, _ = _weight("nvfp4", N, 512, seed=7)
    x = torch.randn(3, 512, generator=torch.Generator().manual_seed(7)).to(DEV, torch.bfloat16)
    cfg = dict(NW=1, CH=2, PER=3)
    y = fp4_mma.fp4_gemm_mma(x, p, config=cfg)
    q = fp4_mma.tile_prepared(p, 1, 2) if tiled else p
    yd = fp4_mma.fp4_gemm_mma(x, q, config=dict(cfg, DIRECT=True, STAGES=stages, TILED=tiled))
    assert torch.equal(y, yd)


# the row-block grid (GRID "rows"): (M, format, K, knobs); N = 81 -> 8 row blocks of 16 (CH 2) or 4 of 32 (CH 1)
ROWS_CASES = {
    "m1-kw2-split2": (1, "nvfp4", 1024, dict(KW=2, SPLIT=2)),
    "m3-kw4-tiled": (3, "nvfp4", 1024, dict(KW=4, SPLIT=1, TILED=True)),
    "m8-ragged-kw1-split2-st1": (8, "mxfp4", 416, dict(KW=1, SPLIT=2, STAGES=1)),
    "m2-ch1-kw2-pre1": (2, "nvfp4", 384, dict(KW=2, SPLIT=1, CH=1, PRE=1)),   # two tiles, LoRA split by rank
    "m3-kw4-pre2": (3, "nvfp4", 512, dict(KW=4, SPLIT=1, PRE=2)),
    "m1-persistent-cpb1": (1, "nvfp4", 512, dict(KW=2, SPLIT=2, CPB=1)),   # programs of several row blocks each
}


@pytest.mark.triton_device
@pytest.mark.parametrize("case", list(ROWS_CASES))
def test_mma_rows_grid_matches_reference(case):
    """The row-block grid (warps splitting a row block's units, their sums met in shared memory, split parts in the
    workspace) against the reference, with bias, LoRA and residual; repeatable bit for bit. On the CPU the twin
    computes it over the stream-K grid (the row-block kernel is Gluon, GPU only)."""
    m, fmt, k, knobs = ROWS_CASES[case]
    p, dense, _ = _weight(fmt, N, k, seed=k + m)
    gen = torch.Generator().manual_seed(m)
    x = torch.randn(m, k, generator=gen).to(DEV, torch.bfloat16)
    b = torch.randn(N, generator=gen).to(DEV, torch.bfloat16)
    t = torch.randn(m, 16, generator=gen).to(DEV, torch.bfloat16)
    lb = (0.1 * torch.randn(p.words.shape[0], 16, generator=gen)).to(DEV, torch.bfloat16)
    res = torch.randn(m, N, generator=gen).to(DEV, torch.bfloat16)
    cfg = dict(knobs, GRID="rows")
    q = fp4_mma.tile_prepared(p, 1, cfg.get("CH", 2)) if cfg.get("TILED") else p
    y = fp4_mma.fp4_gemm_mma(x, q, b, lora=(t, lb), residual=res, config=cfg)
    ref = x.float() @ dense.t() + b.float() + t.float() @ lb[:N].float().t() + res.float()
    check_w4a16_close(y, ref, x.float().abs() @ dense.abs().t() + (t.float() @ lb[:N].float().t()).abs() +
                      res.float().abs() + b.float().abs())
    assert torch.equal(y, fp4_mma.fp4_gemm_mma(x, q, b, lora=(t, lb), residual=res, config=cfg))


@pytest.mark.triton_device
def test_mma_load_only_diagnostic_runs():
    """LOAD_ONLY (the loads without decode and MMAs) runs to an output of the product's shape, which is not the
    product."""
    p, dense, _ = _weight("nvfp4", N, 512, seed=6)
    x = torch.randn(1, 512, generator=torch.Generator().manual_seed(6)).to(DEV, torch.bfloat16)
    y = fp4_mma.fp4_gemm_mma(x, p, config=dict(NW=1, PER=3, LOAD_ONLY=True))
    assert y.shape == (1, N) and not torch.allclose(y.float(), x.float() @ dense.t(), rtol=1e-2, atol=1e-2)


def test_mma_config_and_bad_input():
    """The persistent grid (one wave of about CPS programs an SM; at most MAX_SPLIT programs a row block), and
    errors that name what is wrong."""
    cfg = fp4_mma.mma_config(37888, 448, 132)      # 7B gate/up: 28 chunks, CH 2: 2368 blocks of 16 rows x 14 units
    assert cfg["CH"] == 2 and cfg["PER"] == 16 and cfg["GRID"] == 2072 <= 16 * 132
    cfg = fp4_mma.mma_config(3584, 2368, 132)      # down: 224 blocks x 74 units
    assert cfg["PER"] == 8 and cfg["GRID"] * cfg["PER"] >= 224 * 74
    assert (74 - 1) // cfg["PER"] + 1 <= fp4_mma.MAX_SPLIT
    assert fp4_mma.mma_config(3584, 48, 132)["CH"] == 1   # 3 chunks: no pairs
    p, _, _ = _weight("nvfp4", N, 256, seed=1)
    x = torch.randn(9, 256).to(DEV, torch.bfloat16)
    with pytest.raises(ValueError, match="M = 9"):
        fp4_mma.fp4_gemm_mma(x, p)
    with pytest.raises(ValueError, match="bad knobs"):
        fp4_mma.fp4_gemm_mma(x[:1], p, config=dict(NW=3))
    with pytest.raises(ValueError, match="DIRECT 1-3"):
        fp4_mma.fp4_gemm_mma(x[:1], p, config=dict(DIRECT=True, STAGES=4))
    # the row-block grid's knobs: 7B gate/up 14 units a row block -> 4 warps, one run; down 74 -> 8 warps
    assert fp4_mma.rows_config(37888, 448, 132) == dict(GRID="rows", CH=2, KW=4, SPLIT=1, STAGES=2, CPB=6)
    assert fp4_mma.rows_config(3584, 2368, 132)["KW"] == 8
    if CUDA:
        with pytest.raises(ValueError, match="row-grid knobs"):
            fp4_mma.fp4_gemm_mma(x[:1], p, config=dict(GRID="rows", KW=3))
    with pytest.raises(ValueError, match="residual"):
        fp4_mma.fp4_gemm_mma(x[:1], p, residual=torch.zeros(1, 5, device=DEV, dtype=torch.bfloat16))


def test_mma_selected(monkeypatch):
    x = torch.zeros(4, 16, device=DEV)
    monkeypatch.setenv("QERL_FP4_MMA", "1")
    assert fp4_mma.selected(x) == {} and fp4_mma.selected(torch.zeros(9, 16, device=DEV)) is None
    monkeypatch.setenv("QERL_FP4_MMA", "0")
    assert fp4_mma.selected(x) is None
    monkeypatch.delenv("QERL_FP4_MMA")
    assert fp4_mma.selected(x) == ({} if fp4_mma.DEFAULT_ON and x.is_cuda else None)
    # a committed measurement: the entry's knobs for that device, format, dtype, shape and M only
    p, _, _ = _weight("nvfp4", N, 256, seed=1)
    monkeypatch.setattr(fp4_mma, "MEASURED_WINS", {("h100", 0, "bf16", N, 256, 1): dict(GRID="rows", KW=2)})
    x1 = torch.zeros(1, 256, device=DEV, dtype=torch.bfloat16)
    on_h100 = CUDA and "H100" in torch.cuda.get_device_name()
    assert fp4_mma.selected(x1, p) == (dict(GRID="rows", KW=2) if on_h100 else None)
    assert fp4_mma.selected(torch.zeros(2, 256, device=DEV, dtype=torch.bfloat16), p) is None or fp4_mma.DEFAULT_ON


@pytest.mark.triton_device
def test_dispatch_takes_the_mma_kernel(monkeypatch):
    """fp4_launch.fp4_gemm with QERL_FP4_MMA=1 runs this kernel for M <= 8, LoRA and residual included (a spy)."""
    calls = []
    real = fp4_mma.fp4_gemm_mma
    monkeypatch.setattr(fp4_mma, "fp4_gemm_mma", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    monkeypatch.setenv("QERL_FP4_MMA", "1")
    p, dense, _ = _weight("nvfp4", N, 256, seed=2)
    x = torch.randn(1, 256, generator=torch.Generator().manual_seed(1)).to(DEV, torch.bfloat16)
    res = torch.randn(1, N, generator=torch.Generator().manual_seed(2)).to(DEV, torch.bfloat16)
    y = fp4_launch.fp4_gemm(x, p, residual=res)
    assert calls == [1]
    check_w4a16_close(y, x.float() @ dense.t() + res.float(), x.float().abs() @ dense.abs().t() + res.float().abs())


@pytest.mark.skipif(not CUDA, reason="needs a GPU")
@pytest.mark.parametrize("n,k,m", [(37888, 3584, 1), (3584, 18944, 1), (4608, 3584, 8), (3584, 3584, 3)])
def test_mma_7b_shapes_and_repeatable(n, k, m):
    p, dense, _ = _weight("nvfp4", n, k, seed=n % 97)
    x = torch.randn(m, k, device=DEV).to(torch.bfloat16)
    y = fp4_mma.fp4_gemm_mma(x, p)
    check_w4a16_close(y, x.float() @ dense.t(), x.float().abs() @ dense.abs().t())
    assert torch.equal(y, fp4_mma.fp4_gemm_mma(x, p))


def test_offline_build(offline_build):
    """Every variant compiles for sm_90, spills nothing (under a register cap, MAXNREG: at most 64 bytes, none in
    the main loop), runs its asm on the layout the MMA's lane roles assume, and its main loop issues one MMA and
    under 36 SASS instructions a 4-byte word (40 with K ragged against the 128-column chunk: the activation indices
    clamped; the skinny-M kernel's FMA mode: 51)."""
    r, rows = offline_build("qerl_kernels.fp4_mma")
    assert rows and len(rows) == len(fp4_mma.compile_variants()), r.stderr[-2000:]
    for row in rows:
        assert row["status"] == "ok", row
        assert row["spill_st"] <= (64 if row["maxnreg"] else 0) and row["layout_ok"], row
        if row.get("loop_sass") is not None:
            assert row["hmma"] == 16 and row["sass_per_word"] < (36 if row["even_k"] else 40), row
            assert row["local"] in (0, None), row
