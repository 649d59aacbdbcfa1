"""The backward wgmma kernel (qerl_kernels.fp4_wgmma_t, issue 22: grad_x = grad_y @ W) against the torch reference.

CPU: the stream-K plan over (output tile, M block, n-step), the shared-memory budget of the default ring depths, the
host's shape / knob / layout / weight checks, the backward dispatch's candidates, and (where this Triton has Gluon
and its CUDA backend) that three variants compile for sm_90a through the offline compile check with what the design
relies on (wgmma with A from shared memory, read transposed; no spills; the decoded tile stored with stmatrix).
GPU (Hopper): the 7B single weights at M 1..512 including ragged M and several M blocks, ragged N and K, fp16 and
bf16, the knobs; deterministic (bit-for-bit repeatable) split-K; `fp4_gemm_t(path="wgmma")`.
"""
import functools

import pytest
import torch

triton = pytest.importorskip("triton")

import qerl_kernels  # noqa: E402
from qerl_kernels import fp4_wgmma_t, layout  # noqa: E402
from qerl_kernels import reference as R  # noqa: E402
from qerl_kernels.fp4_gluon import HAVE_GLUON  # noqa: E402

HOPPER = torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9
needs_gluon = pytest.mark.skipif(not HAVE_GLUON, reason="no triton.experimental.gluon")


@pytest.mark.parametrize("n_pad,k_pad,m,sms", [(3584, 3584, 16, 132), (18944, 3584, 64, 132),
                                               (3584, 18944, 128, 132), (512, 3584, 256, 132),
                                               (18944, 3584, 512, 132), (3584, 18944, 300, 132),
                                               (128, 256, 1, 132), (384, 256 * 3, 200, 5)],
                         ids=["q-m16", "gate-m64", "down-m128", "kv-m256", "gate-m512", "down-m300", "one-tile",
                              "few-sms"])
def test_plan_covers_every_iteration_once(n_pad, k_pad, m, sms):
    p = fp4_wgmma_t.wgmma_t_plan(n_pad, k_pad, m, sms)
    assert p["MP"] in (16, 32, 64, 128) and (p["MP"] >= m or p["MP"] == 128)
    assert p["M_BLOCKS"] * p["MP"] >= m > (p["M_BLOCKS"] - 1) * p["MP"]
    assert p["tiles"] == k_pad // 256 * p["M_BLOCKS"] and p["N_STEPS"] * 64 == n_pad
    assert p["TOTAL"] == p["tiles"] * p["N_STEPS"]
    assert p["grid"] <= sms and (p["grid"] - 1) * p["PER"] < p["TOTAL"] <= p["grid"] * p["PER"]
    for tile in range(p["tiles"]):    # no tile cut between more than MAX_PARTS + 1 CTAs
        first, last = tile * p["N_STEPS"], (tile + 1) * p["N_STEPS"] - 1
        assert last // p["PER"] - first // p["PER"] + 1 <= fp4_wgmma_t.MAX_PARTS + 1


def test_plan_fills_the_gpu_with_few_output_tiles():
    """The 7B gate weight's backward at M = 64: 14 output tiles over 148 steps of 128 rows; at most MAX_PARTS CTAs a
    tile still leaves most SMs busy (4 a tile, the forward kernel's limit, gave 56 of 132)."""
    knobs = fp4_wgmma_t.default_knobs(64)
    p = fp4_wgmma_t.wgmma_t_plan(18944, 3584, 64, 132, knobs["bnr"], knobs["max_mp"])
    assert p["tiles"] == 14 and p["N_STEPS"] == 148 and p["grid"] >= 100


@pytest.mark.parametrize("n_pad,k_pad,m", [(128, 128 * 3, 1), (96, 256, 1), (128, 256, 0), (128, 256, 4097)],
                         ids=["k-not-256", "n-not-bnr", "m0", "m-too-big"])
def test_plan_rejects_unsupported(n_pad, k_pad, m):
    with pytest.raises(ValueError, match="fp4_gemm_t_wgmma"):
        fp4_wgmma_t.wgmma_t_plan(n_pad, k_pad, m, 132)


@pytest.mark.parametrize("bnr", [64, 128])
@pytest.mark.parametrize("mp", [16, 32, 64, 128])
def test_default_stages_fit_shared_memory(bnr, mp):
    ws, gs = fp4_wgmma_t.default_stages(bnr, mp)
    if bnr == 128 and mp == 128:    # two [128, 256] decode buffers + 3 g tiles of [128, 128] + 2 weight stages
        assert fp4_wgmma_t.smem_bytes(bnr, mp, ws, gs) > fp4_wgmma_t.SMEM_BUDGET
        return
    assert 2 <= ws <= 8 and 3 <= gs <= 4 and (ws >= 3 or gs == 3)
    assert fp4_wgmma_t.smem_bytes(bnr, mp, ws, gs) <= fp4_wgmma_t.SMEM_BUDGET
    assert ws == 8 or fp4_wgmma_t.smem_bytes(bnr, mp, ws + 1, gs) > fp4_wgmma_t.SMEM_BUDGET - 2048


def _launch(knobs, m=2, n=128, g=None):
    nv, _, _ = qerl_kernels.random_prepared("nvfp4", n, 256, seed=0)
    g = torch.randn(m, n, dtype=torch.bfloat16) if g is None else g
    return fp4_wgmma_t.launch_args(g, nv, torch.empty(g.shape[0], 256, dtype=g.dtype), 132, **knobs)


@needs_gluon
@pytest.mark.parametrize("knobs", [dict(bnr=32), dict(bnr=256), dict(max_mp=8), dict(max_mp=256), dict(load_regs=20),
                                   dict(load_regs=44), dict(wstages=1), dict(gstages=2), dict(gstages=9),
                                   dict(bnr=128, max_mp=128, wstages=8)],
                         ids=["bnr-32", "bnr-256", "mp-8", "mp-256", "regs-20", "regs-44", "wstages-1", "gstages-2",
                              "gstages-9", "smem-over-budget"])
def test_launch_args_rejects_bad_knobs(knobs):
    m = 200 if knobs.get("max_mp") == 128 else 2
    with pytest.raises(ValueError, match="fp4_gemm_t_wgmma"):
        _launch(knobs, m=m)


@needs_gluon
def test_launch_args_rejects_g_layouts_tma_cannot_read_and_default_launch():
    with pytest.raises(ValueError, match="TMA"):        # row stride 132 elements: not a multiple of 16 bytes
        _launch({}, g=torch.empty(2, 132, dtype=torch.bfloat16)[:, :128])
    with pytest.raises(ValueError, match="TMA"):        # N = 124: g's rows are not a multiple of 16 bytes
        _launch({}, n=124, g=torch.empty(2, 124, dtype=torch.bfloat16))
    grid, args, meta = _launch({}, m=200)
    assert meta["MP"] == 128 and meta["BNR"] == 64 and meta["SPLIT"] and meta["num_warps"] == 4
    assert _launch(dict(split=False), m=200)[2]["num_warps"] == fp4_wgmma_t.NUM_WARPS
    assert (meta["WSTAGES"], meta["GSTAGES"]) == fp4_wgmma_t.default_stages(64, 128)
    meta40 = _launch({}, m=40)[2]
    assert (meta40["BNR"], meta40["MP"], meta40["SPLIT"]) == (128, 64, True)   # M <= 128
    assert grid >= 1 and args[3].shape == (128,)        # the weight's factors (one value: ONE_SCALE)


def test_rejects_groups_mxfp4_and_wrong_grad():
    nv, _, _ = qerl_kernels.random_prepared("nvfp4", 128, 256, seed=0)
    mx, _, _ = qerl_kernels.random_prepared("mxfp4", 128, 256, seed=0)
    group = layout.concat_prepared([nv, nv])
    g = torch.randn(2, 128, dtype=torch.bfloat16)
    for w in (mx, group, torch.zeros(128, 256)):
        with pytest.raises(ValueError, match="single PreparedFP4 NVFP4"):
            fp4_wgmma_t.check_grad_operands(g, w)
    for bad in (torch.randn(2, 100, dtype=torch.bfloat16), g.float(), g[0]):
        with pytest.raises(ValueError, match="grad_y must be CUDA"):
            fp4_wgmma_t.check_grad_operands(bad, nv)


def test_backward_candidates(monkeypatch):
    """swap alone up to BWD_FUSED_MIN_TRY; above, wgmma between swap and deq where eligible (never on the CPU, for
    MXFP4, groups, above WGMMA_MAX_M or with QERL_FP4_WGMMA=0); the M above which only deq runs covers it."""
    from qerl_kernels import fp4_launch as L

    w, _, _ = qerl_kernels.random_prepared("nvfp4", 128, 256, seed=1)
    g = lambda m: torch.zeros(m, 128, dtype=torch.bfloat16)  # noqa: E731
    assert L.backward_candidates(g(64), w) == ["swap"]
    assert L.backward_candidates(g(65), w) == ["swap", "deq"]            # CPU: no wgmma
    assert L.dequantize_only_above() >= L.WGMMA_MAX_M
    monkeypatch.setattr(L.torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    monkeypatch.setattr(L, "interpret_mode", lambda: False)
    cuda_like = type("G", (), {"shape": (128, 128), "is_cuda": True, "device": None})()
    assert L._wgmma_eligible(cuda_like, w, backward=True) == HAVE_GLUON
    mx, _, _ = qerl_kernels.random_prepared("mxfp4", 128, 256, seed=1)
    odd, _, _ = qerl_kernels.random_prepared("nvfp4", 128, 576, seed=1)      # K_pad 640: not whole 256 tiles
    group = layout.concat_prepared([w, w])
    assert not any(L._wgmma_eligible(cuda_like, x, backward=True) for x in (mx, odd, group))
    cuda_like.shape = (L.WGMMA_MAX_M + 1, 128)
    assert not L._wgmma_eligible(cuda_like, w, backward=True)
    monkeypatch.setattr(L, "WGMMA_IN_DISPATCH", False)
    cuda_like.shape = (128, 128)
    assert not L._wgmma_eligible(cuda_like, w, backward=True)
    monkeypatch.setattr(L, "_wgmma_eligible", lambda g, w, backward=False: backward)
    assert L.backward_candidates(g(200), w) == ["swap", "wgmma", "deq"]
    assert L.backward_candidates(g(L.BWD_FUSED_MAX_M + 1), w) == ["wgmma", "deq"]


def test_compile_variants_cover_the_7b_weights():
    from qerl_kernels import gluon_compile
    vs = gluon_compile.variants("wgmma_t")
    assert len({v.name for v in vs}) == len(vs) and {v.kernel for v in vs} == {"wgmma_t"}
    default = {(v.n, v.k, v.m) for v in vs if not v.knobs and v.bf16}
    for nk in (gluon_compile.O_PROJ, (512, 3584), (18944, 3584), gluon_compile.DOWN):
        assert {(*nk, m) for m in (16, 64, 128, 256, 512)} <= default
    assert {v.name for v in vs} <= {v.name for v in gluon_compile.variants("all")}


@pytest.mark.skipif(not HAVE_GLUON, reason="no triton.experimental.gluon (Triton with Gluon's Hopper modules)")
def test_compiles_for_sm90_with_shared_a_wgmma(offline_build):
    """Three variants (gate at M = 64: 128 weight rows a step, two consumer partitions; gate at M = 256 in two M
    blocks of 128, one partition, and in M blocks of 64, two partitions) build for sm_90a: one CTA per
    SM, every wgmma reading A from shared memory (a descriptor, transposed), per partition one commit and one wait
    with a group in flight a step plus the tile's final wait, no wgmma serialised by ptxas, the decoded tile stored
    with stmatrix, no spill in the main loop."""
    names = {"wgmma_t-gate-m64", "wgmma_t-one-gate-m256", "wgmma_t-split-mp64-gate-m256"}
    r, out = offline_build("qerl_kernels.gluon_compile", "--kernel", "wgmma_t", "--only", *sorted(names))
    rows = {row["name"]: row for row in out}
    assert r.returncode == 0 and set(rows) == names, (r.stdout, r.stderr[-3000:])
    for name, row in rows.items():
        assert row["status"] == "ok", row["status"]
        parts = 2 if row["split"] else 1      # consumer partitions, each its own copy of the loop
        k_steps = row["bn"] // 16
        assert row["wgmma"] == 2 * k_steps * parts and row["wgmma_reg_a"] == 0, row   # two m64 tiles a warpgroup
        assert row["wgmma_commit"] == parts and row["wgmma_wait"] == 2 * parts and row["wgmma_notes"] == [], row
        assert row["tma"] >= 3 and row["smem_cvt"] > 0 and row["fits"] >= 1, row
        # no spill inside the main loop (SASS); Triton 3.9's ptxas spills 20 bytes in the ragged-M epilogue of
        # down-m200 (3.6's none), once per tile
        assert row.get("loop_local_ops", 0) == 0 and row["spill_st"] <= 64, row
        assert row["smem"] <= fp4_wgmma_t.SMEM_BUDGET, row
    assert rows["wgmma_t-gate-m64"]["wgmma_shapes"] == ["m64n64k16.bf16"] and rows["wgmma_t-gate-m64"]["bn"] == 128
    assert rows["wgmma_t-gate-m64"]["split"] and not rows["wgmma_t-one-gate-m256"]["split"]
    assert rows["wgmma_t-one-gate-m256"]["wgmma_shapes"] == ["m64n128k16.bf16"]


# ---------------------------------------------------------------------------------------------------------------
# GPU (Hopper): against the reference
# ---------------------------------------------------------------------------------------------------------------
needs_hopper = pytest.mark.skipif(not HOPPER or not HAVE_GLUON, reason="needs Gluon on a Hopper (sm_90) GPU")


def _tol(dtype):
    return 4e-3 if dtype == torch.bfloat16 else 1e-3


def _check(prepared, ref_w, dtype, ms, **knobs):
    for m in ms:
        g = torch.randn(m, prepared.n, device="cuda", dtype=dtype)
        o = fp4_wgmma_t.fp4_gemm_t_wgmma(g, prepared, **knobs)
        ref = (g.float() @ ref_w.float()).to(dtype)
        err = R.rel_error(o, ref)
        assert o.shape == (m, prepared.k) and err < _tol(dtype), (prepared.n, prepared.k, m, dtype, knobs, err)
        assert torch.equal(o, fp4_wgmma_t.fp4_gemm_t_wgmma(g, prepared, **knobs)), "split-K must be deterministic"


@functools.lru_cache(maxsize=2)
def _weight(n, k, seed):
    prepared, ref_w, _ = qerl_kernels.random_prepared("nvfp4", n, k, seed=seed, device="cuda")
    return prepared, ref_w


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("n,k", [(3584, 3584), (512, 3584), (18944, 3584), (3584, 18944)],
                         ids=["q", "kv", "gate", "down"])
def test_gpu_7b_weights(n, k, dtype):
    prepared, ref_w = _weight(n, k, n + k)
    _check(prepared, ref_w, dtype, (1, 16, 37, 64, 128, 200, 256, 512))


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_gpu_random_shapes(dtype):
    """Ragged N (a multiple of 8: the rows past N in the last step read as zeros from g and are zero codes in W) and
    ragged K (K_pad a multiple of 256; the output columns past K masked)."""
    gen = torch.Generator().manual_seed(23)
    for trial in range(4):
        n = int(torch.randint(1, 80, (1,), generator=gen)) * 8
        k = int(torch.randint(1, 30, (1,), generator=gen)) * 256 - 48 * (trial % 2)
        prepared, ref_w, _ = qerl_kernels.random_prepared("nvfp4", n, k, seed=trial, device="cuda")
        _check(prepared, ref_w, dtype, (3, 64, 129))


@pytest.mark.parametrize("knobs", [dict(bnr=128, max_mp=64), dict(bnr=64, max_mp=64), dict(bnr=128, max_mp=32),
                                   dict(max_mp=16), dict(bnr=64, max_mp=128, wstages=2, gstages=3),
                                   dict(split=False, bnr=128, max_mp=64), dict(split=True, bnr=64, max_mp=128),
                                   dict(split=True, bnr=64, max_mp=64)],
                         ids=["bnr128-mp64", "bnr64-mp64", "bnr128-mp32", "mp16", "shallow-rings",
                              "one-partition-bnr128", "two-partitions-mp128", "two-partitions-mp64"])
@pytest.mark.gpu
@needs_hopper
def test_gpu_knobs(knobs):
    prepared, ref_w = _weight(3584, 3584, 7168)
    _check(prepared, ref_w, torch.bfloat16, (16, 200, 256), **knobs)


@pytest.mark.gpu
@needs_hopper
def test_gpu_fp4_gemm_t_path_and_autograd():
    """fp4_gemm_t(path="wgmma") is the kernel's product; the autograd backward of a prepared linear at M = 128 (the
    timed choice, whichever path wins) matches the reference gradient."""
    from qerl.layers.ops import w4a16_linear_prepared
    from qerl_kernels.fp4_launch import fp4_gemm_t
    prepared, ref_w = _weight(3584, 3584, 7168)
    g = torch.randn(128, 3584, device="cuda", dtype=torch.bfloat16)
    assert torch.equal(fp4_gemm_t(g, prepared, path="wgmma"), fp4_wgmma_t.fp4_gemm_t_wgmma(g, prepared))
    x = torch.randn(128, 3584, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w4a16_linear_prepared(x, prepared).backward(g)
    assert R.rel_error(x.grad, (g.float() @ ref_w.float()).to(torch.bfloat16)) < _tol(torch.bfloat16)
