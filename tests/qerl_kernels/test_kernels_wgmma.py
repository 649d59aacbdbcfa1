"""The wgmma NVFP4 kernel (qerl_kernels.fp4_wgmma, issue 22: M 16-512) against the torch reference.

CPU: the stream-K plan over (weight tile, M block, k-step), the shared-memory budget of the default ring depths, the
host's shape / knob / layout checks, and (where this Triton has Gluon and its CUDA backend: 3.6 and 3.9 both do)
that two variants compile for sm_90a through the offline compile check (qerl_kernels/gluon_compile.py) with the
properties the design relies on (wgmma with A from registers, no spills, no layout change through shared memory).
GPU (Hopper): the 7B shapes at M 1..512 including ragged M and several M blocks, ragged K, fp16 and bf16, a
q/k/v-style group with per-member factors and a bias, the non-default knobs; deterministic (bit-for-bit repeatable)
split-K.
"""
import dataclasses
import functools

import pytest
import torch

triton = pytest.importorskip("triton")

import qerl_kernels  # noqa: E402
from qerl_kernels import fp4_wgmma, layout  # noqa: E402
from qerl_kernels import reference as R  # noqa: E402
from qerl_kernels.fp4_gluon import HAVE_GLUON  # noqa: E402

HOPPER = torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9
needs_gluon = pytest.mark.skipif(not HAVE_GLUON, reason="no triton.experimental.gluon")


@pytest.mark.parametrize("n_pad,k_pad,m,sms", [(4608, 3584, 16, 132), (37888, 3584, 64, 132),
                                               (3584, 18944, 128, 132), (3584, 3584, 256, 132),
                                               (37888, 3584, 512, 132), (3584, 18944, 300, 132),
                                               (128, 256, 1, 132), (384, 256 * 3, 200, 5)],
                         ids=["qkv-m16", "gateup-m64", "down-m128", "o-m256", "gateup-m512", "down-m300",
                              "one-tile", "few-sms"])
def test_plan_covers_every_iteration_once(n_pad, k_pad, m, sms):
    p = fp4_wgmma.wgmma_plan(n_pad, k_pad, m, sms)
    assert p["MP"] in (16, 32, 64, 128) and (p["MP"] >= m or p["MP"] == 128)
    assert p["M_BLOCKS"] * p["MP"] >= m > (p["M_BLOCKS"] - 1) * p["MP"]
    assert p["tiles"] == n_pad // 128 * p["M_BLOCKS"] and p["K_STEPS"] * 256 == k_pad
    assert p["TOTAL"] == p["tiles"] * p["K_STEPS"]
    # one CTA per SM at most, none empty, every iteration in exactly one range, ranges within one k-step of equal
    assert p["grid"] <= sms and (p["grid"] - 1) * p["PER"] < p["TOTAL"] <= p["grid"] * p["PER"]
    assert p["PER"] <= p["TOTAL"] / p["grid"] + 1 or p["PER"] == -(-p["K_STEPS"] // fp4_wgmma.MAX_PARTS)
    # no tile is cut between more than MAX_PARTS + 1 CTAs (the last one sums the others' partials serially)
    for tile in range(p["tiles"]):
        first, last = tile * p["K_STEPS"], (tile + 1) * p["K_STEPS"] - 1
        assert last // p["PER"] - first // p["PER"] + 1 <= fp4_wgmma.MAX_PARTS + 1


def test_plan_small_launches_keep_k_steps_together():
    """k/v (512 x 3584) at M = 128: 4 tiles x 14 k-steps; one k-step per CTA would cut every tile 14 ways."""
    p = fp4_wgmma.wgmma_plan(512, 3584, 128, 132)
    assert p["PER"] == 4 and p["grid"] == 14


@pytest.mark.parametrize("n_pad,k_pad,m", [(128, 128 * 3, 1), (64, 256, 1), (128, 256, 0), (128, 256, 4097)],
                         ids=["k-not-256", "n-not-bn", "m0", "m-too-big"])
def test_plan_rejects_unsupported(n_pad, k_pad, m):
    with pytest.raises(ValueError, match="fp4_gemm_wgmma"):
        fp4_wgmma.wgmma_plan(n_pad, k_pad, m, 132)


@pytest.mark.parametrize("bn", [64, 128])
@pytest.mark.parametrize("mp", [16, 32, 64, 128, 256])
def test_default_stages_fit_shared_memory(bn, mp):
    ws, xs = fp4_wgmma.default_stages(bn, mp)
    assert 2 <= ws <= 8 and 2 <= xs <= 8
    assert fp4_wgmma.smem_bytes(bn, mp, ws, xs) <= fp4_wgmma.SMEM_BUDGET
    # the weight ring is as deep as fits: one more stage would not
    assert ws == 6 or fp4_wgmma.smem_bytes(bn, mp, ws + 1, xs) > fp4_wgmma.SMEM_BUDGET - 2048


def _launch(knobs, m=2, k=256, x=None):
    nv, _, _ = qerl_kernels.random_prepared("nvfp4", 128, k, seed=0)
    x = torch.randn(m, k, dtype=torch.bfloat16) if x is None else x
    return fp4_wgmma.launch_args(x, nv, None, torch.empty(x.shape[0], 128, dtype=x.dtype), 132, **knobs)


@needs_gluon
@pytest.mark.parametrize("knobs", [dict(num_warps=2), dict(num_warps=12), dict(max_mp=100), dict(max_mp=512),
                                   dict(ks=16), dict(load_regs=20), dict(load_regs=44), dict(wstages=1),
                                   dict(xstages=9), dict(wstages=8, xstages=8), dict(outstanding=3),
                                   dict(outstanding=2, ks=128)],
                         ids=["warps-2", "warps-12", "mp-100", "mp-512", "ks-16", "regs-20", "regs-44", "wstages-1",
                              "xstages-9", "smem-over-budget", "outstanding-3", "outstanding-2-ks128"])
def test_launch_args_rejects_bad_knobs(knobs):
    m = 200 if "xstages" in knobs else 2      # 8 x stages of [128, 128] bf16 alone are 256 KiB
    with pytest.raises(ValueError, match="fp4_gemm_wgmma"):
        _launch(knobs, m=m)


@needs_gluon
def test_launch_args_rejects_x_layouts_tma_cannot_read():
    with pytest.raises(ValueError, match="TMA"):        # row stride 260 elements: not a multiple of 16 bytes
        _launch({}, x=torch.empty(2, 260, dtype=torch.bfloat16)[:, :256])
    with pytest.raises(ValueError, match="TMA"):        # column-major x
        _launch({}, x=torch.empty(256, 2, dtype=torch.bfloat16).t())


def test_tma_rows_copies_one_row_views_and_odd_offsets():
    """x = buf[:1, :K] is "contiguous" with buf's row stride (PyTorch ignores a size-1 dimension's stride), which
    TMA cannot take (262 bf16 = 524 bytes): fp4_gemm_wgmma copies it, and a view at an odd offset, to dense rows."""
    buf = torch.randn(1, 262, dtype=torch.bfloat16)
    for x in (buf[:, :256], buf[:, 2:258]):
        assert x.is_contiguous() and x.stride(0) == 262
        t = fp4_wgmma._tma_rows(x)
        assert t.stride() == (256, 1) and t.data_ptr() % 16 == 0 and torch.equal(t, x)
    x = torch.randn(4, 256, dtype=torch.bfloat16)
    assert fp4_wgmma._tma_rows(x) is x                      # already TMA-ready: no copy
    if HAVE_GLUON:
        _launch({}, m=1, x=fp4_wgmma._tma_rows(buf[:, :256]))   # accepted by the launcher


@needs_gluon
@pytest.mark.parametrize("kernel", ["fp4_gemm_wgmma", "fp4_gemm_gluon"])
def test_rejects_x_on_another_device(kernel):
    """Both Gluon kernels' operand check (fp4_gluon.check_operands): x off the weight's device is an error, not a
    TMA descriptor into another device's memory."""
    from qerl_kernels import fp4_gluon
    nv, _, _ = qerl_kernels.random_prepared("nvfp4", 128, 256, seed=0)
    on_meta = dataclasses.replace(nv, words=nv.words.to("meta"), scales=nv.scales.to("meta"),
                                  out_scales=nv.out_scales.to("meta"))
    fn = getattr(fp4_wgmma if kernel == "fp4_gemm_wgmma" else fp4_gluon, kernel)
    with pytest.raises(ValueError, match=f"{kernel}: x must be on the weight's device"):
        fn(torch.randn(2, 256, dtype=torch.bfloat16), on_meta)


@needs_gluon
def test_launch_args_default_launch():
    grid, args, meta = _launch({}, m=300, k=512)
    assert grid == 6                              # 1 weight tile x 3 M blocks x 2 k-steps: one iteration per CTA
    assert meta["BN"] == 128 and meta["MP"] == 128 and meta["num_warps"] == 8 and meta["maxnreg"] == 168
    assert meta["KS"] == 64 and meta["LOAD_REGS"] == 24
    assert (meta["WSTAGES"], meta["XSTAGES"]) == fp4_wgmma.default_stages(128, 128)


@needs_gluon
@pytest.mark.parametrize("kernel", ["fp4_gemm_wgmma", "fp4_gemm_gluon"])
def test_rejects_mxfp4_cpu_wrong_x_and_other_weights(kernel):
    """Both Gluon kernels' operand check (fp4_gluon.check_operands): MXFP4, a CPU x, x of the wrong width or
    dtype, a weight that is not a PreparedFP4."""
    from qerl_kernels import fp4_gluon
    fn = getattr(fp4_wgmma if kernel == "fp4_gemm_wgmma" else fp4_gluon, kernel)
    mx, _, _ = qerl_kernels.random_prepared("mxfp4", 128, 256, seed=0)
    nv, _, _ = qerl_kernels.random_prepared("nvfp4", 128, 256, seed=0)
    x = torch.randn(2, 256, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="NVFP4"):
        fn(x, mx)
    with pytest.raises(ValueError, match="CUDA"):
        fn(x, nv)
    with pytest.raises(ValueError, match="x must be"):
        fn(torch.randn(2, 128, dtype=torch.bfloat16), nv)
    with pytest.raises(ValueError, match="x must be"):
        fn(x.float(), nv)
    with pytest.raises(ValueError, match="PreparedFP4"):
        fn(x, torch.zeros(128, 256))


def test_compile_variants_cover_the_7b_shapes_and_rl_batch_sizes():
    from qerl_kernels import gluon_compile
    vs = gluon_compile.variants("wgmma")
    assert len({v.name for v in vs}) == len(vs) and {v.kernel for v in vs} == {"wgmma"}
    default = {(v.n, v.k, v.m) for v in vs if not v.knobs and v.bf16 and not v.bias}
    for nk in (gluon_compile.QKV, gluon_compile.O_PROJ, gluon_compile.GATE_UP, gluon_compile.DOWN):
        assert {(*nk, m) for m in (16, 64, 128, 256, 512)} <= default
    assert {v.bf16 for v in vs} == {True, False} and {v.bias for v in vs} == {True, False}
    assert {v.name for v in gluon_compile.variants("all")} == \
        {v.name for v in gluon_compile.variants("gluon")} | {v.name for v in vs} | \
        {v.name for v in gluon_compile.variants("wgmma_t")}


@pytest.mark.skipif(not HAVE_GLUON, reason="no triton.experimental.gluon (Triton with Gluon's Hopper modules: 3.6 "
                    "on the GPU image, 3.9 in CI)")
def test_compiles_for_sm90_with_register_a_wgmma(offline_build):
    """The offline compile check of three variants (default knobs at M = 64 and 512, i.e. MP 64 and four M blocks
    of 128; fp16 + bias at a ragged M = 200 on down_proj): builds for sm_90a, one CTA per SM, the TMA rings, every
    wgmma taking its A operand from registers (the decoded tile never goes through shared memory), 4 async groups
    per k-step, and no wgmma serialised by ptxas (no "warpgroup.wait is injected": the decode / wgmma overlap
    holds). No spill inside the main loop; at M = 64 none at all; a ragged M (Triton 3.6) or several M blocks
    (3.9's newer ptxas) spill up to 72 bytes in the epilogue, once per tile (kernels.notes.md). In a fresh process
    without TRITON_INTERPRET (see test_kernels_gluon.test_compiles_for_sm90)."""
    names = {"wgmma-gateup-m64", "wgmma-gateup-m512", "wgmma-fp16-bias-down-m200"}
    r, out = offline_build("qerl_kernels.gluon_compile", "--only", *sorted(names))
    rows = {row["name"]: row for row in out}
    assert r.returncode == 0 and set(rows) == names, (r.stdout, r.stderr[-3000:])
    for row in rows.values():
        assert row["status"] == "ok", row["status"]
        # 4 groups (64 columns each) x 4 k16 instructions, all with register A; each group committed and waited
        # on with one in flight, plus the wait for all at a tile's end
        assert row["wgmma"] == 16 and row["wgmma_reg_a"] == row["wgmma"], row
        assert row["wgmma_commit"] == 4 and row["wgmma_wait"] == 5 and row["wgmma_notes"] == [], row
        assert row["tma"] >= 3 and row["smem_cvt"] == 0 and len(row["setmaxnreg"]) >= 2, row
        assert row["fits"] >= 1 and row["smem"] <= fp4_wgmma.SMEM_BUDGET, row
        # no spill inside the main loop (SASS of the cubin Triton built); a few in the epilogue at most
        assert row.get("loop_local_ops", 0) == 0 and row["spill_st"] <= 128, row
    assert rows["wgmma-gateup-m64"]["spill_st"] == 0 and rows["wgmma-gateup-m64"]["spill_ld"] == 0
    assert rows["wgmma-gateup-m64"]["wgmma_shapes"] == ["m64n64k16.bf16"]
    assert rows["wgmma-gateup-m512"]["wgmma_shapes"] == ["m64n128k16.bf16"]
    assert rows["wgmma-fp16-bias-down-m200"]["wgmma_shapes"] == ["m64n128k16.f16"]


# ---------------------------------------------------------------------------------------------------------------
# GPU (Hopper): against the reference
# ---------------------------------------------------------------------------------------------------------------
def _tol(dtype):
    # one rounding of the fp32 result to the output dtype (bf16: 2**-8), plus summation-order noise
    return 4e-3 if dtype == torch.bfloat16 else 1e-3


def _check(prepared, ref_w, k, dtype, ms, bias=None, **knobs):
    for m in ms:
        x = torch.randn(m, k, device="cuda", dtype=dtype)
        y = fp4_wgmma.fp4_gemm_wgmma(x, prepared, bias, **knobs)
        ref = R._linear(x, ref_w, bias)
        err = R.rel_error(y, ref)
        assert y.shape == (m, prepared.n) and err < _tol(dtype), (prepared.n, k, m, dtype, knobs, err)
        assert torch.equal(y, fp4_wgmma.fp4_gemm_wgmma(x, prepared, bias, **knobs)), "split-K must be deterministic"


needs_hopper = pytest.mark.skipif(not HOPPER or not HAVE_GLUON, reason="needs Gluon on a Hopper (sm_90) GPU")


@functools.lru_cache(maxsize=2)
def _weight(n, k, seed):
    """A seeded random NVFP4 weight on the GPU (prepared, dense reference), quantized once for both dtypes (the 7B
    shapes take seconds each on the CPU)."""
    prepared, ref_w, _ = qerl_kernels.random_prepared("nvfp4", n, k, seed=seed, device="cuda")
    return prepared, ref_w


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("n,k", [(4608, 3584), (3584, 3584), (18944, 3584), (3584, 18944)],
                         ids=["qkv", "o", "gate", "down"])
def test_gpu_7b_shapes(n, k, dtype):
    prepared, ref_w = _weight(n, k, n + k)
    _check(prepared, ref_w, k, dtype, (1, 16, 37, 64, 128, 200, 256, 512))


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_gpu_group_bias_and_random_shapes(dtype):
    members = [qerl_kernels.random_prepared("nvfp4", rows, 512, seed=7 + rows, scale=2.0 ** i, device="cuda")
               for i, rows in enumerate((384, 64, 64))]
    group = layout.concat_prepared([p for p, _, _ in members])
    ref = torch.cat([torch.nn.functional.pad(w, (0, 0, 0, p.words.shape[0] - p.n)) for p, w, _ in members])
    bias = torch.randn(group.n, device="cuda", dtype=dtype)
    _check(group, ref[:group.n], 512, dtype, (1, 17, 130, 300), bias)
    gen = torch.Generator().manual_seed(22)
    for trial in range(3):
        n = int(torch.randint(1, 60, (1,), generator=gen)) * 16 + trial % 2   # rows padded to 128
        # K ragged in trials 1, 2 (K_pad still a multiple of 256): the last x box reads columns past K, which TMA
        # must fill with zeros (the weight's padded codes and scales are zeros too)
        k = int(torch.randint(1, 30, (1,), generator=gen)) * 256 - 48 * trial
        prepared, ref_w, _ = qerl_kernels.random_prepared("nvfp4", n, k, seed=trial, device="cuda")
        _check(prepared, ref_w, k, dtype, (3, 64, 129), torch.randn(n, device="cuda", dtype=dtype) if trial else None)


@pytest.mark.parametrize("knobs", [dict(num_warps=4), dict(max_mp=256), dict(max_mp=64), dict(ks=128), dict(ks=32),
                                   dict(max_mp=256, ks=32), dict(wstages=2, xstages=2), dict(outstanding=2),
                                   dict(outstanding=2, ks=32), dict(outstanding=2, num_warps=4, xstages=2)],
                         ids=["one-warpgroup", "mp256", "mp64", "ks128", "ks32", "mp256-ks32", "shallow-rings",
                              "out2", "out2-ks32", "out2-one-warpgroup-2-xstages"])
@pytest.mark.gpu
@needs_hopper
def test_gpu_knobs(knobs):
    prepared, ref_w = _weight(4608, 3584, 4608 + 3584)
    _check(prepared, ref_w, 3584, torch.bfloat16, (16, 200, 256), **knobs)


# --- the default dispatch (fp4_launch.fp4_gemm): the wgmma kernel as one timed candidate above M = 64 -------------

def test_dispatch_candidates_and_switch(monkeypatch):
    """forward_candidates: swap alone up to FUSED_MIN_TRY; above, wgmma between swap and deq where eligible
    (never on the CPU, for MXFP4, above WGMMA_MAX_M, or with QERL_FP4_WGMMA=0, read at import as
    WGMMA_IN_DISPATCH)."""
    from qerl_kernels import fp4_launch as L

    w, _, _ = qerl_kernels.random_prepared("nvfp4", 128, 256, seed=1)
    x = lambda m: torch.zeros(m, 256, dtype=torch.bfloat16)  # noqa: E731
    assert L.forward_candidates(x(64), w) == ["swap"]
    assert L.forward_candidates(x(65), w) == ["swap", "deq"]            # CPU: no wgmma
    monkeypatch.setattr(L, "_wgmma_eligible", lambda x, w: x.shape[0] <= L.WGMMA_MAX_M)
    assert L.forward_candidates(x(65), w) == ["swap", "wgmma", "deq"]
    assert L.forward_candidates(x(L.FUSED_MAX_M + 1), w) == ["deq"]
    monkeypatch.undo()
    monkeypatch.setattr(L, "WGMMA_IN_DISPATCH", False)
    assert not L._wgmma_eligible(x(128), w)
    mx, _, _ = qerl_kernels.random_prepared("mxfp4", 128, 256, seed=1)
    monkeypatch.setattr(L, "WGMMA_IN_DISPATCH", True)
    assert not L._wgmma_eligible(x(128), mx) and not L._wgmma_eligible(x(128), w)   # MXFP4; CPU
    # shapes its TMA tiles cannot cover are left out before any device check: K_pad 640 (K = 576)
    odd, _, _ = qerl_kernels.random_prepared("nvfp4", 128, 576, seed=1)
    monkeypatch.setattr(L.torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    monkeypatch.setattr(L, "interpret_mode", lambda: False)
    cuda_like = type("X", (), {"shape": (128, 576), "is_cuda": True, "device": None})()
    assert not L._wgmma_eligible(cuda_like, odd)
    cuda_like.shape = (128, 256)
    assert L._wgmma_eligible(cuda_like, w) == HAVE_GLUON


def test_dispatch_wgmma_path_adds_lora_and_residual(monkeypatch):
    """path "wgmma": the kernel's product (+ bias), then the LoRA term and the residual, as the deq path computes
    them (the kernel replaced by the dense reference on the CPU; on a GPU test_gpu_dispatch runs the kernel)."""
    from qerl_kernels import fp4_launch as L

    w, dense, _ = qerl_kernels.random_prepared("nvfp4", 64, 256, seed=2)
    seen = {}

    def fake(x, w_, bias=None, **knobs):
        seen.update(knobs, called=True)
        return R._linear(x, dense, bias).to(x.dtype)

    monkeypatch.setattr(fp4_wgmma, "fp4_gemm_wgmma", fake)
    gen = torch.Generator().manual_seed(0)
    x, t, b, bias, res = (torch.randn(*s, generator=gen).half() for s in ((80, 256), (80, 16), (64, 16), (64,),
                                                                            (80, 64)))
    y = L.fp4_gemm(x, w, bias, path="wgmma", lora=(t, b), residual=res, config={"num_warps": 4})
    ref = x.float() @ dense.t() + bias.float() + t.float() @ b.float().t() + res.float()
    assert seen == {"num_warps": 4, "called": True} and y.dtype == torch.float16
    assert R.rel_error(y, ref) < 2e-3


@pytest.mark.gpu
@needs_hopper
def test_gpu_dispatch_lora_residual_and_graph_capture():
    """On the GPU the default dispatch may pick wgmma for M 65-512: every forced path, LoRA and residual included,
    agrees with the reference; the chosen path replays the same result inside a CUDA graph (the rollout captures)."""
    from qerl_kernels import fp4_launch as L

    prepared, ref_w = _weight(18944, 3584, 18944 + 3584)
    gen = torch.Generator(device="cuda").manual_seed(3)
    for m in (128, 256):
        x = torch.randn(m, 3584, device="cuda", dtype=torch.bfloat16, generator=gen)
        t = torch.randn(m, 32, device="cuda", dtype=torch.bfloat16, generator=gen)
        b = torch.randn(18944, 32, device="cuda", dtype=torch.bfloat16, generator=gen) * 0.05
        res = torch.randn(m, 18944, device="cuda", dtype=torch.bfloat16, generator=gen)
        ref = (R._linear(x, ref_w, None).float() + t.float() @ b.float().t() + res.float())
        for path in ("wgmma", "swap", "deq", None):
            y = L.fp4_gemm(x, prepared, path=path, lora=(t, b), residual=res)
            assert R.rel_error(y, ref) < 1e-2, (m, path)
        assert "wgmma" in L.forward_candidates(x, prepared)
        eager = L.fp4_gemm(x, prepared, lora=(t, b), residual=res)
        graph, out = torch.cuda.CUDAGraph(), None
        with torch.cuda.graph(graph):
            out = L.fp4_gemm(x, prepared, lora=(t, b), residual=res)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, eager), m


def test_dispatch_timing_graph_then_eager_then_inf(monkeypatch):
    """_time_or_inf(graph=True) times in a CUDA graph (what the engine replays); an uncapturable call falls back
    to the eager timing; a call that fails both ways is never chosen (inf)."""
    from qerl_kernels import fp4_launch as L

    calls = []

    def graph(fn, rep):
        calls.append("graph")
        if fn() == "uncapturable":
            raise RuntimeError("operation not permitted when stream is capturing")
        return 1.0

    def eager(fn, warmup, rep, return_mode="mean"):
        calls.append("eager")
        assert return_mode == "median", "an eager time is the median of its calls (the host's outliers left out)"
        if fn() == "broken":
            raise RuntimeError("compile error")
        return 2.0

    monkeypatch.setattr(L.triton.testing, "do_bench_cudagraph", graph)
    monkeypatch.setattr(L.triton.testing, "do_bench", eager)
    monkeypatch.setattr(L.torch.cuda, "synchronize", lambda: None)
    assert L._time_or_inf(lambda: "ok", "swap", graph=True) == 1.0 and calls == ["graph"]
    calls.clear()
    assert L._time_or_inf(lambda: "uncapturable", "wgmma", graph=True) == 2.0 and calls == ["graph", "eager"]
    calls.clear()
    assert L._time_or_inf(lambda: "ok", "swap") == 2.0 and calls == ["eager"]   # the backward's choice: eager
    assert L._time_or_inf(lambda: "broken", "tc") == float("inf")
