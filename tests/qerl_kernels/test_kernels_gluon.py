"""The Gluon NVFP4 kernel (qerl_kernels.fp4_gluon, issue 22) against the torch reference.

CPU: the split/grid plan, the input and knob checks, and (where this Triton has Gluon and its CUDA backend: 3.6 and
3.9 both do) that two variants compile for sm_90a through the offline compile check (qerl_kernels/gluon_compile.py).
GPU (Hopper or newer): the 7B shapes, a q/k/v group and random shapes against the reference, fp16 and bf16,
M = 1..64, with and without bias.
"""

import pytest
import torch

triton = pytest.importorskip("triton")

import qerl_kernels  # noqa: E402
from qerl_kernels import fp4_gluon, layout  # noqa: E402
from qerl_kernels import reference as R  # noqa: E402

CUDA = torch.cuda.is_available()
HOPPER = CUDA and torch.cuda.get_device_capability()[0] >= 9


def _tol(dtype):
    # one rounding of the fp32 result to the output dtype (bf16: 2**-8), plus summation-order noise
    return 4e-3 if dtype == torch.bfloat16 else 1e-3


@pytest.mark.parametrize("n_pad,k_pad,m,sms", [(3584, 3584, 1, 132), (512, 3584, 16, 132), (37888, 3584, 8, 132),
                                               (3584, 18944, 1, 132), (128, 256, 64, 8), (128, 256 * 5, 3, 100)])
def test_plan_balances_stream_k(n_pad, k_pad, m, sms):
    p = fp4_gluon.gluon_plan(n_pad, k_pad, m, sms)
    assert p["MP"] >= m and p["MP"] in (8, 16, 32, 64)
    assert p["tiles"] * 64 == n_pad and p["K_STEPS"] * fp4_gluon.BK == k_pad
    assert p["TOTAL"] == p["tiles"] * p["K_STEPS"]
    # every CTA non-empty, all iterations covered once, no CTA more than one iteration above the mean
    assert (p["grid"] - 1) * p["PER"] < p["TOTAL"] <= p["grid"] * p["PER"]
    assert p["grid"] <= 2 * sms and p["PER"] <= p["TOTAL"] / p["grid"] + 1


@pytest.mark.parametrize("n_pad,k_pad,m", [(128, 128 * 3, 1), (100, 256, 1), (128, 256, 0), (128, 256, 65)])
def test_plan_rejects_unsupported(n_pad, k_pad, m):
    with pytest.raises(ValueError, match="fp4_gemm_gluon"):
        fp4_gluon.gluon_plan(n_pad, k_pad, m, 132)


# The operand checks (MXFP4, CPU x, wrong x, a weight that is not a PreparedFP4, x off the weight's device), shared
# with the wgmma kernel (fp4_gluon.check_operands): tests/qerl_kernels/test_kernels_wgmma.py, for both kernels.


def test_compile_variants_cover_the_benchmark_and_the_sweep():
    from qerl_kernels import gluon_compile
    from qerl_kernels.tune import GLUON_SWEEP
    vs = gluon_compile.variants()
    names = [v.name for v in vs]
    assert len(names) == len(set(names))
    assert {max(8, 1 << (v.m - 1).bit_length()) for v in vs} == {8, 16, 32, 64}   # every MP
    swept = {(v.knobs["bn"], v.knobs["num_warps"], v.knobs["stages"], v.knobs["ctas_per_sm"]) for v in vs if v.knobs}
    assert swept == set(GLUON_SWEEP)
    assert {v.bf16 for v in vs} == {True, False} and {v.bias for v in vs} == {True, False}


@pytest.mark.skipif(not fp4_gluon.HAVE_GLUON, reason="no triton.experimental.gluon")
@pytest.mark.parametrize("knobs", [dict(bn=64, num_warps=2), dict(bn=96, num_warps=4), dict(bn=64, num_warps=8),
                                   dict(stages=0), dict(load_regs=20), dict(load_regs=44)])
def test_launch_args_rejects_bad_knobs(knobs):
    nv, _, _ = qerl_kernels.random_prepared("nvfp4", 128, 256, seed=0)
    x = torch.randn(2, 256, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="fp4_gemm_gluon"):
        fp4_gluon.launch_args(x, nv, None, torch.empty(2, 128, dtype=torch.bfloat16), 132, **knobs)


@pytest.mark.skipif(not fp4_gluon.HAVE_GLUON, reason="no triton.experimental.gluon (Triton with Gluon's Hopper "
                    "modules: 3.6 on the GPU image, 3.9 in CI)")
def test_compiles_for_sm90(offline_build):
    """The offline compile check (gluon_compile) of two variants: the launcher's own arguments through the JIT's
    binding -> TTGIR -> PTX -> cubin for sm_90a with the bundled ptxas, so a Gluon API, layout or resource error
    shows on the CPU machine, not on the GPU. In a fresh process without TRITON_INTERPRET: the interpreter, once it
    has run a kernel in this process, leaves triton.language patched for itself and a real compile then fails."""
    r, out = offline_build("qerl_kernels.gluon_compile", "--only", "bench-m1", "tune-128-8-4-2-m16")
    rows = {row["name"]: row for row in out}
    assert r.returncode == 0 and set(rows) == {"bench-m1", "tune-128-8-4-2-m16"}, (r.stdout, r.stderr[-3000:])
    for row in rows.values():
        assert row["status"] == "ok", row["status"]
        assert row["tma"] > 0 and row["mma"] > 0 and len(row["setmaxnreg"]) >= 2, row  # TMA ring, mma.sync, own regs
        assert row["smem_cvt"] == 0, row           # decoded weights and scales never round-trip shared memory
        assert row["regs"] <= row["maxnreg"] and row["fits"] >= row["ctas_per_sm"] and row["cubin"] > 0, row
    assert rows["bench-m1"]["spill_st"] == 0 and rows["bench-m1"]["smem"] < 40 * 1024, rows["bench-m1"]


# ---------------------------------------------------------------------------------------------------------------
# GPU (Hopper): against the reference
# ---------------------------------------------------------------------------------------------------------------
def _check(prepared, ref_w, k, dtype, ms, bias=None):
    for m in ms:
        x = torch.randn(m, k, device="cuda", dtype=dtype)
        y = fp4_gluon.fp4_gemm_gluon(x, prepared, bias)
        ref = R._linear(x, ref_w, bias)
        err = R.rel_error(y, ref)
        assert err < _tol(dtype), (prepared.n, k, m, dtype, err)
        y2 = fp4_gluon.fp4_gemm_gluon(x, prepared, bias)
        assert torch.equal(y, y2), "split-K reduction must be deterministic"


@pytest.mark.gpu
@pytest.mark.skipif(not HOPPER or not fp4_gluon.HAVE_GLUON, reason="needs Gluon on a Hopper (sm_90+) GPU")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("n,k", [(3584, 3584), (512, 3584), (18944, 3584), (3584, 18944)])
def test_gpu_7b_shapes(n, k, dtype):
    prepared, ref_w, _ = qerl_kernels.random_prepared("nvfp4", n, k, seed=n + k, device="cuda")
    _check(prepared, ref_w, k, dtype, (1, 4, 8, 16, 64))


@pytest.mark.gpu
@pytest.mark.skipif(not HOPPER or not fp4_gluon.HAVE_GLUON, reason="needs Gluon on a Hopper (sm_90+) GPU")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_gpu_random_shapes_bias_and_group(dtype):
    gen = torch.Generator().manual_seed(22)
    for trial in range(4):
        n = int(torch.randint(1, 60, (1,), generator=gen)) * 16 + int(trial % 2)   # rows padded to 128
        k = int(torch.randint(1, 30, (1,), generator=gen)) * 256
        prepared, ref_w, _ = qerl_kernels.random_prepared("nvfp4", n, k, seed=trial, device="cuda")
        bias = torch.randn(n, device="cuda", dtype=dtype) if trial % 2 else None
        _check(prepared, ref_w, k, dtype, (1, 3, 9, 16, 33), bias)
    members = [qerl_kernels.random_prepared("nvfp4", rows, 512, seed=7 + rows, scale=2.0 ** i, device="cuda")
               for i, rows in enumerate((384, 64, 64))]
    group = layout.concat_prepared([p for p, _, _ in members])
    ref = torch.cat([torch.nn.functional.pad(w, (0, 0, 0, p.words.shape[0] - p.n)) for p, w, _ in members])
    _check(group, ref[:group.n], 512, dtype, (1, 16))
