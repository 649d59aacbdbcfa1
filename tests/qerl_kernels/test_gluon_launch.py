"""The Gluon kernels' eager launch with the compiled binary reused (qerl_kernels.gluon_launch, issue 22).

CPU: the key separates what Triton specializes on (an int being 1 or a multiple of 16, a pointer's 16-byte
alignment, a descriptor's dtype / block / layout / columns / strides, every meta parameter) and not what it does not
(an int's other values, a descriptor's row count); the first launch of a key goes through the JIT and is recorded,
the next ones run the recorded binary with every parameter in signature order (meta and defaults included), and a
launch hook sends them all through the JIT. The weights' descriptors are built once a weight.
GPU (Hopper): for the three Gluon kernels at M 1..512, the binary recorded is the one the JIT picks for the same
arguments, and the cached launch gives the JIT launch's bits.
"""
import functools

import pytest
import torch

triton = pytest.importorskip("triton")

import qerl_kernels  # noqa: E402
from qerl_kernels import gluon_launch as GL  # noqa: E402
from qerl_kernels.fp4_gluon import HAVE_GLUON  # noqa: E402

HOPPER = torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9
needs_hopper = pytest.mark.skipif(not HOPPER or not HAVE_GLUON, reason="needs Gluon on a Hopper (sm_90) GPU")


class _Desc:
    """A stand-in TMA descriptor (the fields _spec reads)."""

    def __init__(self, base, block_shape, layout="L", padding="zero"):
        self.base, self.block_shape, self.layout, self.padding = base, block_shape, layout, padding
        self.shape, self.strides = list(base.shape), list(base.stride())


def _key(args, meta=None):
    return GL.spec_key("kernel", tuple(args), meta or {"BN": 64}, 0)


def test_key_separates_what_triton_specializes_on():
    t = torch.zeros(64, dtype=torch.bfloat16)
    assert _key([1]) != _key([2]) and _key([16]) != _key([17]) and _key([2 ** 31]) != _key([2 ** 31 - 1])
    assert _key([t]) != _key([t[1:]]), "16-byte alignment"
    assert _key([t]) != _key([t.float()]), "dtype"
    assert _key([t], {"BN": 64}) != _key([t], {"BN": 128})
    assert _key([True]) != _key([False]) and _key([None]) != _key([0])
    a, b = torch.zeros(128, 256, dtype=torch.bfloat16), torch.zeros(128, 512, dtype=torch.bfloat16)
    assert _key([_Desc(a, [64, 64])]) != _key([_Desc(a, [64, 128])]), "block shape"
    assert _key([_Desc(a, [64, 64])]) != _key([_Desc(a, [64, 64], layout="M")]), "layout"
    assert _key([_Desc(a, [64, 64])]) != _key([_Desc(b, [64, 64])]), "columns and strides"
    assert _key([_Desc(a, [64, 64])]) != _key([_Desc(a.float(), [64, 64])]), "dtype"


def test_key_ignores_what_triton_does_not_specialize_on():
    assert _key([17, 2.5]) == _key([18, 3.5]) and _key([32]) == _key([48])
    rows = [torch.zeros(m, 256, dtype=torch.bfloat16) for m in (1, 37, 512)]
    assert len({_key([_Desc(r, [64, 64])]) for r in rows}) == 1, "the row count is a runtime value of a descriptor"
    d = _Desc(rows[0], [64, 64])
    assert _key([d]) == _key([d]) and d._spec_facts, "a descriptor's facts are kept on it"


class _Compiled:
    def __init__(self, calls):
        self.calls, self.function, self.packed_metadata = calls, "fn", "meta"

    def run(self, *a):
        self.calls.append(("cached", a))


class _Param:
    def __init__(self, name, default=None):
        self.name, self.default = name, default


class _Kernel:
    """A stand-in JIT function: kernel[grid](*args, **meta) records the call and returns one compiled kernel."""

    def __init__(self):
        self.calls = []
        self.compiled = _Compiled(self.calls)
        self.params = [_Param("x"), _Param("n"), _Param("BN"), _Param("FLAG", default=7)]

    def __getitem__(self, grid):
        def run(*args, **meta):
            self.calls.append(("jit", grid, args, meta))
            return self.compiled
        return run


@pytest.fixture
def no_cuda(monkeypatch):
    monkeypatch.setattr(GL, "_COMPILED", {})
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda device: 1234, raising=False)


def test_launch_records_then_runs_the_binary(no_cuda):
    k = _Kernel()
    x = torch.zeros(8)
    GL.launch(k, 5, (x, 3), {"BN": 64, "num_warps": 4})
    assert k.calls == [("jit", (5,), (x, 3), {"BN": 64, "num_warps": 4})]
    GL.launch(k, 6, (x, 19), {"BN": 64, "num_warps": 4})   # 19: same facts as 3 (not 1, not a multiple of 16)
    kind, a = k.calls[-1]
    assert kind == "cached" and a[:9] == (6, 1, 1, 1234, "fn", "meta", None, None, None)
    assert a[9:] == (x, 19, 64, 7), "every parameter in signature order: positional, meta, defaults"
    GL.launch(k, 6, (x, 16), {"BN": 64, "num_warps": 4})   # a multiple of 16: another specialization
    assert k.calls[-1][0] == "jit" and len(GL.cached_launches()) == 2


def test_launch_hook_sends_every_launch_through_the_jit(no_cuda, monkeypatch):
    from triton import knobs
    k = _Kernel()
    hook = knobs.runtime.launch_enter_hook
    if hasattr(hook, "calls"):   # Triton 3.5+: a chain of hooks
        monkeypatch.setattr(hook, "calls", [_no_op])
    else:
        monkeypatch.setattr(knobs.runtime, "launch_enter_hook", _no_op)
    for _ in range(2):
        GL.launch(k, 5, (torch.zeros(8), 3), {"BN": 64})
    assert [c[0] for c in k.calls] == ["jit", "jit"] and not GL.cached_launches()
    monkeypatch.undo()
    assert not GL._hooked(), "the hook is gone with the test"


def _no_op(*args):
    return None


@pytest.mark.skipif(not HAVE_GLUON, reason="no triton.experimental.gluon")
def test_weight_descriptors_built_once_a_weight():
    from qerl_kernels.fp4_gluon import weight_descriptors
    w, _, _ = qerl_kernels.random_prepared("nvfp4", 256, 512, seed=0)
    d64 = weight_descriptors(w, 64)
    assert weight_descriptors(w, 64) is d64 and weight_descriptors(w, 128) is not d64
    assert d64[0].base is w.words and d64[1].base is w.scales and list(d64[0].block_shape) == [64, 32]
    w2, _, _ = qerl_kernels.random_prepared("nvfp4", 256, 512, seed=1)
    assert weight_descriptors(w2, 64)[0].base is w2.words
    w.words = w.words[:128]   # a view at the same address, other rows: its own descriptor
    assert list(weight_descriptors(w, 64)[0].shape) == [128, w.words.shape[1]]


@functools.lru_cache(maxsize=1)
def _weight(n, k):
    prepared, _, _ = qerl_kernels.random_prepared("nvfp4", n, k, seed=n + k, device="cuda")
    return prepared


def _launches():
    """(name, kernel, op, launch_args builder, Ms) of the three Gluon kernels."""
    from qerl_kernels import fp4_gluon, fp4_wgmma, fp4_wgmma_t
    sms = torch.cuda.get_device_properties(0).multi_processor_count

    def fwd(mod):
        def build(x, w):
            y = torch.empty(x.shape[0], w.n, device="cuda", dtype=x.dtype)
            return y, mod.launch_args(x, w, None, y, sms)
        return build

    def bwd(g, w):
        o = torch.empty(g.shape[0], w.k, device="cuda", dtype=g.dtype)
        return o, fp4_wgmma_t.launch_args(g, w, o, sms)

    return [("gluon", fp4_gluon._fp4_gemm_ws, fp4_gluon.fp4_gemm_gluon, fwd(fp4_gluon), (1, 16, 37, 64), False),
            ("wgmma", fp4_wgmma._fp4_gemm_wgmma, fp4_wgmma.fp4_gemm_wgmma, fwd(fp4_wgmma), (1, 64, 128, 200, 512),
             False),
            ("wgmma_t", fp4_wgmma_t._fp4_gemm_t_wgmma, fp4_wgmma_t.fp4_gemm_t_wgmma, bwd, (1, 64, 128, 200, 512),
             True)]


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize("which", ["gluon", "wgmma", "wgmma_t"])
def test_gpu_cached_binary_is_the_jits(which):
    name, kernel, op, build, ms, backward = next(c for c in _launches() if c[0] == which)
    w = _weight(3584, 18944)
    for dtype in (torch.bfloat16, torch.float16):
        for m in ms:
            x = torch.randn(m, w.n if backward else w.k, device="cuda", dtype=dtype)
            first, second = op(x, w), op(x, w)           # the JIT's launch, then the cached one
            out, (grid, args, meta) = build(x, w)
            compiled = GL.cached_launches()[GL.spec_key(kernel, args, meta, torch.cuda.current_device())]
            assert compiled is kernel.warmup(*args, grid=(grid,), **meta), (name, m, dtype)
            kernel[(grid,)](*args, **meta)               # the JIT's launch of the same arguments
            assert torch.equal(first, second) and torch.equal(second, out), (name, m, dtype)


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize("which", ["wgmma", "wgmma_t"])
def test_gpu_cached_launch_in_a_cuda_graph(which):
    """The rollout engine captures the forward kernel in CUDA graphs (decode steps at M 65-512): the cached launch
    records on the capturing stream, and a replay reads the graph's input buffer as it is at replay time."""
    _, _, op, _, _, backward = next(c for c in _launches() if c[0] == which)
    w = _weight(3584, 18944)
    x = torch.randn(128, w.n if backward else w.k, device="cuda", dtype=torch.bfloat16)
    op(x, w)   # the key's first launch (through the JIT) outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = op(x, w)
    x2 = torch.randn_like(x)
    x.copy_(x2)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, op(x2, w)), which
