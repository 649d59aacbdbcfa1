"""Benchmark the FP4 W4A16 kernels on the linear layers of Qwen2.5-3B/7B/14B/32B, in one run.

Why: the kernels issue sets speed targets (7B shapes, one GPU, one run): at M = 1..16, >= 3.0x bf16 summed over a
decoder layer's GEMMs and >= 80% of the device-to-device copy bandwidth; >= 2x at M = 64; >= 0.9x at M >= 2048;
>= 5x bitsandbytes NF4 at M = 1; backward input gradient within 1.15x of bf16. This script measures every number
those targets need, plus the same for the other model sizes, and writes them with provenance.

What it times (median of CUDA-event-timed replays of a CUDA graph that runs the op once per weight copy; enough
copies that one pass over them exceeds the L2 cache, so every call streams its weight from HBM):
    bf16              F.linear(x, W_bf16)                       (cuBLAS)
    nvfp4 / mxfp4     qerl_kernels.fp4_gemm, default dispatch: fused kernel for M <= 64, dequantize + cuBLAS
                      above 512, in between whichever was faster when first timed
    nvfp4_fused       forced swap-AB kernel (M >= 128)
    nvfp4_deq_cublas  forced dequantize + cuBLAS (M >= 128)
    nvfp4_tc          forced tensor-core tiles, qerl_kernels.fp4_launch.fp4_gemm_tc (M >= 64)
    nf4               bitsandbytes matmul_4bit, QLoRA settings (blocksize 64, double quant, bf16 compute)
    bf16_bwd          grad_y @ W_bf16                           (the backward input gradient)
    nvfp4_bwd         qerl_kernels.fp4_gemm_t (grad_y @ W), default dispatch: fused transposed kernel for M <= 64,
                      dequantize + cuBLAS above 256, in between whichever was faster when first timed
    nvfp4_bwd_fused / nvfp4_bwd_deq_cublas   the two backward paths forced (16 < M <= 256)
    nvfp4_bwd_tc      the backward through the tensor-core tiles (single weights, M >= 64)
    nvfp4_bwd_wgmma   the backward wgmma kernel (Gluon: the decoded tile as wgmma's A operand from shared memory),
                      qerl_kernels.fp4_wgmma_t (single weights, 16 <= M <= 512; issue 22)
    nvfp4_dequantize  the standalone dequantize kernel alone (M column = 0)
    nvfp4_gluon       the warp-specialized Gluon kernel, qerl_kernels.fp4_gluon.fp4_gemm_gluon (M <= 64; issue 22)
    nvfp4_wgmma       the Gluon wgmma kernel (register-A async wgmma, TMA rings), qerl_kernels.fp4_wgmma.fp4_gemm_wgmma
                      (M <= 512; issue 22, RL batch sizes); not in the default dispatch
    nvfp4_gemv / mxfp4_gemv   the skinny-M split-K kernel with its heuristic knobs, qerl_kernels.fp4_gemv
                      (M <= 16; issue 22 item 4); rows where it beats the default path by >= 3 % are written as
                      fp4_gemv.MEASURED_WINS entries to gemv-wins.txt (commit them to make the dispatch take it)
    nvfp4_mma / mxfp4_mma     the decode-size MMA kernel (decoded pairs as mma.sync A fragments), qerl_kernels.fp4_mma
                      (M <= 8; issue 22 item 4)
Groups (layers qkv_proj and gate_up_proj): q/k/v and gate/up as one weight each, NVFP4 members quantized one by one
and joined by concat_prepared (one launch), bf16 as one concatenated matrix; summed with o_proj and down_proj
into a 4-launch layer (bench_report.GROUPED_LAYERS).
plus the memory-bandwidth ceiling (read_ceiling: the best of a torch copy, graph and eager, torch.sum and a Triton
streaming read; every row's pct_ceiling = (weight + activation bytes) / time / ceiling) and an 8192^3 bf16 matmul.

Run (GPU):  python -m qerl_kernels.bench --out results/measured/h200 --commit $(git rev-parse HEAD)
Quick:      python -m qerl_kernels.bench --models 7B --m 1 16 2048 --out /tmp/b
Output: kernels.csv (one row per model, layer, M, method) and, rendered from it by bench_report.py,
kernels.summary.md (layer sums), kernels.png, kernels.provenance.md (GPU, driver, torch, triton, bitsandbytes,
commit, date, command).
--prewarm N first compiles every kernel variant in N processes (prewarm.py). The device memory of one decoder layer's
QuantLinear layers (the torch layer above these kernels) is `python -m qerl.profiling.layer_memory`.
"""
from __future__ import annotations

import argparse
import csv
import math
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from qerl_kernels.fp4_decoder import HAVE_TRITON
from qerl_kernels.bench_report import plot, provenance, summarize
from qerl_kernels.prewarm import prewarm

if HAVE_TRITON:
    import triton
    import triton.language as tl

# (hidden, intermediate, heads, kv_heads, head_dim) of the Qwen2.5 instruct models (config.json on the hub)
MODELS = {
    "3B": (2048, 11008, 16, 2, 128),
    "7B": (3584, 18944, 28, 4, 128),
    "14B": (5120, 13824, 40, 8, 128),
    "32B": (5120, 27648, 40, 8, 128),
}
M_VALUES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 2048, 8192)


def layer_shapes(model: str) -> dict[str, tuple[int, int]]:
    """{layer: (N, K)} of one decoder layer (weight [N, K], y = x @ W^T)."""
    h, inter, heads, kv, hd = MODELS[model]
    return {"q_proj": (heads * hd, h), "k_proj": (kv * hd, h), "v_proj": (kv * hd, h), "o_proj": (h, heads * hd),
            "gate_proj": (inter, h), "up_proj": (inter, h), "down_proj": (h, inter)}


GROUPS = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}


def group_shapes(model: str) -> dict[str, tuple[tuple[int, int], ...]]:
    """{group: member shapes} of one decoder layer: q/k/v and gate/up, each run as one launch."""
    shapes = layer_shapes(model)
    return {g: tuple(shapes[m] for m in members) for g, members in GROUPS.items()}


# ---------------------------------------------------------------------------------------------------------------
def time_calls(fns, target_ms: float = 40.0, max_reps: int = 50) -> tuple[float, str]:
    """Median milliseconds of one call, averaged over the calls in `fns` (one per weight copy).

    Captures all calls in one CUDA graph and times replays with CUDA events (falls back to an eager loop if the
    op cannot be captured). Returns (ms per call, "graph" | "eager").
    """
    for f in fns:  # warm up: autotuning, compilation, workspace allocation stay out of the graph
        f()
    torch.cuda.synchronize()
    mode = "graph"
    try:
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for f in fns:
                f()
        run = g.replay
    except Exception:  # noqa: BLE001 - anything uncapturable is timed eagerly
        mode = "eager"
        torch.cuda.synchronize()

        def run():
            for f in fns:
                f()
    run()
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    run()
    e.record()
    torch.cuda.synchronize()
    reps = int(min(max_reps, max(5, target_ms / max(s.elapsed_time(e), 1e-3))))
    evs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
    for a, b in evs:
        a.record()
        run()
        b.record()
    torch.cuda.synchronize()
    times = sorted(a.elapsed_time(b) for a, b in evs)
    return times[len(times) // 2] / len(fns), mode


def time_graph(fn) -> float:
    """Microseconds of one replay of `fn` captured as a CUDA graph (`time_calls`), for probes of what a decode step
    replays (qerl_kernels.bench_lora, qerl_kernels.l2_prefetch). Raises RuntimeError if `fn` cannot be captured."""
    ms, mode = time_calls([fn])
    if mode != "graph":
        raise RuntimeError("time_graph: the op could not be captured in a CUDA graph")
    return ms * 1e3


def load_module_file(path: str | Path, name: str):
    """The module in source file `path` (e.g. an earlier commit's version of one of ours, `git show REV:FILE`),
    imported under `name`, for a before / after comparison in one process on one GPU (qerl_kernels.bench_lora's
    --decode-file, qerl.profiling.step_trace's --engine-file).

    Raises:
        FileNotFoundError: no such file.
    """
    import importlib.util

    if not Path(path).is_file():
        raise FileNotFoundError(f"load_module_file: no file {path}")
    spec = importlib.util.spec_from_file_location(name, str(path))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def copies_for(nbytes: int, l2: int, cap: int = 256) -> int:
    """Weight copies so that one pass over them is at least 2.5x the L2 cache."""
    return int(min(cap, max(2, math.ceil(2.5 * l2 / max(nbytes, 1)))))


if HAVE_TRITON:
    @triton.jit
    def _stream_read(x_ptr, out_ptr, n_blocks, BLOCK: tl.constexpr):
        """Read-only streaming kernel for the bandwidth ceiling: a persistent grid sums int32 blocks (16-byte
        vector loads) and writes one int32 per program, so the bytes moved are the bytes read."""
        pid = tl.program_id(0)
        acc = tl.zeros([BLOCK], dtype=tl.int32)
        offs = tl.arange(0, BLOCK)
        for i in range(pid, n_blocks, tl.num_programs(0)):
            acc += tl.load(x_ptr + i.to(tl.int64) * BLOCK + offs, cache_modifier=".cg")
        tl.store(out_ptr + pid, tl.sum(acc))


def read_ceiling(nbytes: int = 2 << 30) -> tuple[float, dict[str, float]]:
    """The memory-bandwidth ceiling of this GPU: the best of several streaming kernels over a buffer far larger than
    L2 (GB/s of bytes moved: a copy counts read + write, the reductions read only).

    Why several (issue 22): one kernel's figure can sit well below the physical limit: the committed H200 run's
    2706 GB/s copy (a torch copy timed inside a CUDA graph) was below what cuBLAS itself moved in that run, so every
    percentage taken against it was too high. Kernels: torch copy in a CUDA graph (the old figure), the same copy
    eager, torch.sum over the buffer as float32, and a Triton streaming read (16-byte loads, one int32 out per
    program). Returns (best GB/s, {kernel: GB/s}).
    """
    a = torch.empty(nbytes, dtype=torch.uint8, device="cuda").random_()
    b = torch.empty_like(a)
    t = time.time()
    while time.time() - t < 0.5:  # let clocks settle: an idle GPU starts at a low SM clock
        b.copy_(a)
        torch.cuda.synchronize()
    res = {}
    ms, _ = time_calls([lambda: b.copy_(a)], target_ms=200, max_reps=20)
    res["torch copy, CUDA graph (read + write)"] = 2 * nbytes / ms / 1e6
    evs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(10)]
    for s, e in evs:
        s.record()
        b.copy_(a)
        e.record()
    torch.cuda.synchronize()
    res["torch copy, eager (read + write)"] = 2 * nbytes / sorted(s.elapsed_time(e) for s, e in evs)[5] / 1e6
    del b
    f = a.view(torch.float32)
    ms, _ = time_calls([lambda: f.sum()], target_ms=200, max_reps=20)
    res["torch.sum float32 (read)"] = nbytes / ms / 1e6
    if HAVE_TRITON:
        block = 8192
        n_blocks = nbytes // 4 // block
        grid = 4 * torch.cuda.get_device_properties(0).multi_processor_count
        out = torch.empty(grid, dtype=torch.int32, device="cuda")
        x32 = a.view(torch.int32)
        ms, _ = time_calls([lambda: _stream_read[(grid,)](x32, out, n_blocks, BLOCK=block, num_warps=8)],
                           target_ms=200, max_reps=20)
        res["Triton streaming read, 16-byte loads (read)"] = n_blocks * block * 4 / ms / 1e6
    del a, f
    torch.cuda.empty_cache()
    return max(res.values()), res


def matmul_tflops(n: int = 8192) -> float:
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    ms, _ = time_calls([lambda: a @ b], target_ms=200, max_reps=20)
    return 2 * n ** 3 / ms / 1e9


# ---------------------------------------------------------------------------------------------------------------
class ShapeBench:
    """All methods on one weight shape [N, K]: holds the weight copies in every format.

    `members` (a group such as q/k/v): the NVFP4 weight is the members quantized one by one (each with its own
    per-tensor scale) and joined by `concat_prepared`; bf16 is the same weights as one [N, K] matrix; MXFP4 and NF4
    are not measured for groups."""

    def __init__(self, n: int, k: int, l2: int, bnb, dtype=torch.bfloat16, members=None):
        from qerl_kernels import layout, mxfp4, nvfp4
        from qerl_kernels.reference import mxfp4_quantize_reference, nvfp4_quantize_reference

        self.n, self.k, self.dtype = n, k, dtype
        w = torch.randn(n, k, device="cuda") * 0.02
        self.w_bf16 = w.to(dtype)
        self.group = members is not None
        if self.group:
            rows = [0]
            for mn, _ in members:
                rows.append(rows[-1] + mn)
            self.nv_prepared = layout.concat_prepared(
                [nvfp4.prepare(*nvfp4_quantize_reference(w[a:b])) for a, b in zip(rows[:-1], rows[1:])])
            self.bytes = {"bf16": n * k * 2, "nvfp4": self.nv_prepared.nbytes}
            self.copies = {
                "bf16": [self.w_bf16.clone() for _ in range(copies_for(self.bytes["bf16"], l2))],
                "nvfp4": [_clone_prepared(self.nv_prepared) for _ in range(copies_for(self.bytes["nvfp4"], l2))]}
            self.bnb = None
            del w
            return
        codes, scales, gs = nvfp4_quantize_reference(w)
        self.nv = (codes, scales, gs)
        self.nv_prepared = nvfp4.prepare(codes, scales, gs)
        mcodes, mscales = mxfp4_quantize_reference(w)
        self.mx_prepared = mxfp4.prepare(mcodes, mscales)
        self.bytes = {"bf16": n * k * 2, "nvfp4": self.nv_prepared.nbytes, "mxfp4": self.mx_prepared.nbytes}
        self.copies = {
            "bf16": [self.w_bf16.clone() for _ in range(copies_for(self.bytes["bf16"], l2))],
            "nvfp4": [_clone_prepared(self.nv_prepared) for _ in range(copies_for(self.bytes["nvfp4"], l2))],
            "mxfp4": [_clone_prepared(self.mx_prepared) for _ in range(copies_for(self.bytes["mxfp4"], l2))],
        }
        self.bnb = bnb
        if bnb is not None:
            q, state = bnb.functional.quantize_4bit(self.w_bf16, blocksize=64, compress_statistics=True,
                                                    quant_type="nf4")
            self.bytes["nf4"] = q.numel() * q.element_size() + _state_bytes(state)
            n_copies = copies_for(self.bytes["nf4"], l2)
            self.copies["nf4"] = [bnb.functional.quantize_4bit(self.w_bf16, blocksize=64, compress_statistics=True,
                                                               quant_type="nf4") for _ in range(n_copies)]
        del w

    def _first_call_runs(self, method: str, m: int, fns) -> bool:
        """Whether the first call of a method's kernel runs here: one that cannot compile or is not supported (a config
        set, a GPU without its instructions) is reported and skipped, and the other methods still get timed."""
        try:
            fns[0]()
        except Exception as e:  # noqa: BLE001 - report, go on
            print(f"{method} N={self.n} K={self.k} M={m}: {type(e).__name__}: {str(e)[:300]}", flush=True)
            return False
        return True

    def run(self, method: str, m: int):
        """(ms per call, timing mode, weight bytes per call) for `method` at M = m; None if not applicable."""
        from qerl_kernels.fp4_launch import fp4_dequantize, fp4_gemm, fp4_gemm_t

        if method.split("_")[0] in ("mxfp4", "nf4") and method.split("_")[0] not in self.copies:
            return None
        x = torch.randn(m, self.k, device="cuda", dtype=self.dtype)
        g = torch.randn(m, self.nv_prepared.n if self.group else self.n, device="cuda", dtype=self.dtype)
        if method == "bf16":
            fns = [lambda w=w: F.linear(x, w) for w in self.copies["bf16"]]
            wb = self.bytes["bf16"]
        elif method in ("nvfp4", "mxfp4", "nvfp4_fused", "nvfp4_deq_cublas"):
            fmt = method[:5]
            fused = {"nvfp4_fused": True, "nvfp4_deq_cublas": False}.get(method)
            fns = [lambda w=w: fp4_gemm(x, w, fused=fused) for w in self.copies[fmt]]
            wb = self.bytes[fmt]
        elif method == "nf4":
            if self.bnb is None:
                return None
            fns = [lambda q=q, s=s: self.bnb.matmul_4bit(x, q.t(), quant_state=s) for q, s in self.copies["nf4"]]
            wb = self.bytes["nf4"]
        elif method == "bf16_bwd":
            fns = [lambda w=w: g @ w for w in self.copies["bf16"]]
            wb = self.bytes["bf16"]
        elif method in ("nvfp4_bwd", "nvfp4_bwd_fused", "nvfp4_bwd_deq_cublas"):
            fused = {"nvfp4_bwd_fused": True, "nvfp4_bwd_deq_cublas": False}.get(method)
            fns = [lambda w=w: fp4_gemm_t(g, w, fused=fused) for w in self.copies["nvfp4"]]
            wb = self.bytes["nvfp4"]
        elif method == "nvfp4_bwd_wgmma":
            if self.group or m > 512:
                return None
            fns = [lambda w=w: fp4_gemm_t(g, w, path="wgmma") for w in self.copies["nvfp4"]]
            wb = self.bytes["nvfp4"]
            if not self._first_call_runs(method, m, fns):
                return None
        elif method in ("nvfp4_tc", "nvfp4_bwd_tc"):
            if method == "nvfp4_bwd_tc" and self.group:
                return None
            if method == "nvfp4_tc":
                fns = [lambda w=w: fp4_gemm(x, w, path="tc") for w in self.copies["nvfp4"]]
            else:
                fns = [lambda w=w: fp4_gemm_t(g, w, path="tc") for w in self.copies["nvfp4"]]
            wb = self.bytes["nvfp4"]
            if not self._first_call_runs(method, m, fns):
                return None
        elif method == "nvfp4_gluon":
            if m > 64:
                return None
            from qerl_kernels.fp4_gluon import fp4_gemm_gluon
            fns = [lambda w=w: fp4_gemm_gluon(x, w) for w in self.copies["nvfp4"]]
            wb = self.bytes["nvfp4"]
            if not self._first_call_runs(method, m, fns):
                return None
        elif method == "nvfp4_wgmma":
            from qerl_kernels.fp4_wgmma import MAX_M, fp4_gemm_wgmma
            if m > MAX_M:
                return None
            fns = [lambda w=w: fp4_gemm_wgmma(x, w) for w in self.copies["nvfp4"]]
            wb = self.bytes["nvfp4"]
            if not self._first_call_runs(method, m, fns):
                return None
        elif method in ("nvfp4_gemv", "mxfp4_gemv"):
            from qerl_kernels.fp4_gemv import GEMV_MAX_M
            if m > GEMV_MAX_M:
                return None
            fns = [lambda w=w: fp4_gemm(x, w, path="gemv") for w in self.copies[method[:5]]]
            wb = self.bytes[method[:5]]
            if not self._first_call_runs(method, m, fns):
                return None
        elif method in ("nvfp4_mma", "mxfp4_mma"):
            from qerl_kernels.fp4_mma import MMA_MAX_M
            if m > MMA_MAX_M:
                return None
            fns = [lambda w=w: fp4_gemm(x, w, path="mma") for w in self.copies[method[:5]]]
            wb = self.bytes[method[:5]]
            if not self._first_call_runs(method, m, fns):
                return None
        elif method == "nvfp4_dequantize":
            fns = [lambda w=w: fp4_dequantize(w, self.dtype) for w in self.copies["nvfp4"]]
            wb = self.bytes["nvfp4"] + self.n * self.k * 2  # reads 4.5 bits, writes 16 bits per weight
        else:
            raise ValueError(f"unknown method {method!r}")
        ms, mode = time_calls(fns)
        return ms, mode, wb


def _clone_prepared(p):
    from qerl_kernels.layout import PreparedFP4
    return PreparedFP4(p.words.clone(), p.scales.clone(), p.out_scales.clone(), p.n, p.k, p.scale_kind, p.parts)


def _state_bytes(state) -> int:
    total = 0
    for name in ("absmax", "code"):
        t = getattr(state, name, None)
        if isinstance(t, torch.Tensor):
            total += t.numel() * t.element_size()
    nested = getattr(state, "state2", None)
    if nested is not None:
        total += _state_bytes(nested)
    return total


def check_correctness(shapes, out_lines: list[str], groups=(), gluon: bool = True) -> bool:
    """Every kernel against the float32 reference on every benchmark shape (fresh random weights and inputs).

    Forward (fused kernel), backward input gradient (fused transposed kernel), dequantize (bit-exact), both
    formats, fp16 and bf16 (NVFP4 forward also through the Gluon kernel unless `gluon` is False); then the q/k/v and
    gate/up groups of the first model (forward and backward)."""
    from qerl_kernels.fp4_launch import fp4_dequantize, fp4_gemm, fp4_gemm_t
    from qerl_kernels.layout import concat_prepared
    from qerl_kernels.reference import (mxfp4_dequantize_reference, mxfp4_quantize_reference,
                                        nvfp4_dequantize_reference, nvfp4_quantize_reference)
    from qerl_kernels.reference import rel_error as rel
    from qerl_kernels import mxfp4, nvfp4

    ok = True
    for n, k in shapes:
        w = torch.randn(n, k, device="cuda") * torch.exp(torch.randn(n, 1, device="cuda"))
        c, s, gs = nvfp4_quantize_reference(w)
        pn, rn = nvfp4.prepare(c, s, gs), nvfp4_dequantize_reference(c, s, gs)
        mc, ms = mxfp4_quantize_reference(w)
        pm, rm = mxfp4.prepare(mc, ms), mxfp4_dequantize_reference(mc, ms)
        for fmt, p, ref in (("nvfp4", pn, rn), ("mxfp4", pm, rm)):
            for dtype in (torch.bfloat16, torch.float16):
                exact = torch.equal(fp4_dequantize(p, dtype), ref.to(dtype))
                errs, berrs = [], []
                for m in (1, 5, 16, 40, 64, 200):
                    x = torch.randn(m, k, device="cuda", dtype=dtype)
                    y = fp4_gemm(x, p, fused=True)
                    r = (x.float() @ ref.t()).to(dtype).float()
                    errs.append(rel(y, r))
                    g = torch.randn(m, n, device="cuda", dtype=dtype)
                    gx = fp4_gemm_t(g, p, fused=True)
                    berrs.append(rel(gx, (g.float() @ ref).to(dtype)))
                for m in (64, 200, 1000):  # the tensor-core tiles, both directions
                    x = torch.randn(m, k, device="cuda", dtype=dtype)
                    errs.append(rel(fp4_gemm(x, p, path="tc"), (x.float() @ ref.t()).to(dtype).float()))
                    g = torch.randn(m, n, device="cuda", dtype=dtype)
                    berrs.append(rel(fp4_gemm_t(g, p, path="tc"), (g.float() @ ref).to(dtype)))
                tol = 4e-3 if dtype == torch.bfloat16 else 1e-3
                good = exact and max(errs + berrs) < tol and all(math.isfinite(e) for e in errs + berrs)
                ok &= good
                out_lines.append(f"check {fmt} {str(dtype)[6:]} N={n} K={k}: dequant exact={exact} "
                                 f"max rel err fwd={max(errs):.2e} bwd={max(berrs):.2e} {'OK' if good else 'FAIL'}")
                print(out_lines[-1], flush=True)
                if fmt == "nvfp4" and gluon:  # the Gluon kernel (issue 22), where this Triton has Gluon
                    from qerl_kernels.fp4_gluon import HAVE_GLUON, fp4_gemm_gluon
                    if HAVE_GLUON:
                        gerrs = []
                        try:
                            for m in (1, 5, 16, 40, 64):
                                x = torch.randn(m, k, device="cuda", dtype=dtype)
                                gerrs.append(rel(fp4_gemm_gluon(x, p), (x.float() @ ref.t()).to(dtype).float()))
                            gok = max(gerrs) < tol and all(math.isfinite(e) for e in gerrs)
                            msg = f"max rel err fwd={max(gerrs):.2e}"
                        except Exception as e:  # noqa: BLE001 - report and go on: the other kernels still get timed
                            gok, msg = False, f"{type(e).__name__}: {str(e)[:300]}"
                        ok &= gok
                        out_lines.append(f"check nvfp4_gluon {str(dtype)[6:]} N={n} K={k}: {msg} "
                                         f"{'OK' if gok else 'FAIL'}")
                        print(out_lines[-1], flush=True)
    for members in groups:
        k = members[0][1]
        ws = [torch.randn(mn, k, device="cuda") * torch.exp(torch.randn(1, device="cuda") * 2) for mn, _ in members]
        q = [nvfp4_quantize_reference(w) for w in ws]
        grp = concat_prepared([nvfp4.prepare(*t) for t in q])
        ref = torch.cat([nvfp4_dequantize_reference(*t) for t in q])
        errs = []
        for m in (1, 16, 64):
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            errs.append(rel(fp4_gemm(x, grp, fused=True), (x.float() @ ref.t()).bfloat16()))
            g = torch.randn(m, grp.n, device="cuda", dtype=torch.bfloat16)
            errs.append(rel(fp4_gemm_t(g, grp, fused=True), (g.float() @ ref).bfloat16()))
        exact = torch.equal(fp4_dequantize(grp, torch.bfloat16), ref.bfloat16())
        good = exact and max(errs) < 4e-3
        ok &= good
        out_lines.append(f"check nvfp4 group {[mn for mn, _ in members]}x{k}: dequant exact={exact} "
                         f"max rel err fwd/bwd={max(errs):.2e} {'OK' if good else 'FAIL'}")
        print(out_lines[-1], flush=True)
    return ok


def _random_group(members, k: int, device: str = "cuda"):
    """A q/k/v- or gate/up-style group of NVFP4 weights (members of [rows, k], each with its own scale), concatenated,
    and its float32 dequantized reference."""
    from qerl_kernels import nvfp4
    from qerl_kernels.layout import concat_prepared
    from qerl_kernels.reference import nvfp4_dequantize_reference, nvfp4_quantize_reference

    q = [nvfp4_quantize_reference(torch.randn(mn, k, device=device) * torch.exp(torch.randn(1, device=device)))
         for mn, _ in members]
    grp = concat_prepared([nvfp4.prepare(*t) for t in q])
    ref = torch.zeros(grp.n, k, device=device)
    for (row, mn), t in zip(grp.parts, q):
        ref[row:row + mn] = nvfp4_dequantize_reference(*t)
    return grp, ref


def _check_kernel(name: str, kernel, shapes, groups, out_lines: list[str], *, formats, ms, group_ms, bias_ms,
                  device: str = "cuda") -> bool:
    """`kernel(x, prepared, bias)` against the float32 reference: each shape in each of `formats`, bf16 and fp16, at
    every M of `ms` (with a bias at those in `bias_ms`), and bit-for-bit repeatability of its split reduction; then
    each group of `groups` (NVFP4, bf16) at `group_ms`. A wrong result or an exception is a FAIL line, never raised:
    the other kernels still get timed. (`device`: "cpu" for the checker's own tests.)"""
    from qerl_kernels import mxfp4, nvfp4
    from qerl_kernels.reference import (mxfp4_dequantize_reference, mxfp4_quantize_reference,
                                        nvfp4_dequantize_reference, nvfp4_quantize_reference)
    from qerl_kernels.reference import rel_error as rel

    def run(p, ref, dtype, m_list):
        errs, same = [], True
        for m in m_list:
            x = torch.randn(m, ref.shape[1], device=device, dtype=dtype)
            b = torch.randn(ref.shape[0], device=device, dtype=dtype) if m in bias_ms else None
            y = kernel(x, p, b)
            errs.append(rel(y, (x.float() @ ref.t() + (b.float() if b is not None else 0)).to(dtype)))
            same &= torch.equal(kernel(x, p, b), y)
        return errs, same

    def cases():  # (label, prepared, reference, dtypes, M list), weights drawn as each case comes
        for n, k in shapes:
            w = torch.randn(n, k, device=device) * torch.exp(torch.randn(n, 1, device=device))
            if "nvfp4" in formats:
                c, s, gs = nvfp4_quantize_reference(w)
                yield f"nvfp4 N={n} K={k}", nvfp4.prepare(c, s, gs), nvfp4_dequantize_reference(c, s, gs), \
                    (torch.bfloat16, torch.float16), ms
            if "mxfp4" in formats:
                mc, msc = mxfp4_quantize_reference(w)
                yield f"mxfp4 N={n} K={k}", mxfp4.prepare(mc, msc), mxfp4_dequantize_reference(mc, msc), \
                    (torch.bfloat16, torch.float16), ms
        for members in groups:
            grp, ref = _random_group(members, members[0][1], device)
            yield f"nvfp4 group {[mn for mn, _ in members]}x{members[0][1]}", grp, ref, (torch.bfloat16,), group_ms

    ok = True
    for label, p, ref, dtypes, m_list in cases():
        fmt, where = label.split(" ", 1)
        for dtype in dtypes:
            tol = 4e-3 if dtype == torch.bfloat16 else 1e-3
            try:
                errs, same = run(p, ref, dtype, m_list)
                good = same and max(errs) < tol and all(math.isfinite(e) for e in errs)
                msg = f"max rel err fwd={max(errs):.2e} repeatable={same}"
            except Exception as e:  # noqa: BLE001 - report and go on: the other kernels still get timed
                good, msg = False, f"{type(e).__name__}: {str(e)[:300]}"
            ok &= good
            out_lines.append(f"check {fmt}_{name} {str(dtype)[6:]} {where}: {msg} {'OK' if good else 'FAIL'}")
            print(out_lines[-1], flush=True)
    return ok


def check_gemv(shapes, out_lines: list[str], groups=()) -> bool:
    """The skinny-M kernel (fp4_gemv, heuristic knobs) against the float32 reference on the benchmark shapes: both
    formats, fp16 and bf16, M = 1, 2, 3, 4, 5, 8, 16 (bias at M = 3 and 8), and bit-for-bit repeatability of its
    split-K reduction; then the q/k/v and gate/up groups (NVFP4, bf16, M 1, 4, 16)."""
    from qerl_kernels.fp4_gemv import fp4_gemm_gemv
    return _check_kernel("gemv", fp4_gemm_gemv, shapes, groups, out_lines, formats=("nvfp4", "mxfp4"),
                         ms=(1, 2, 3, 4, 5, 8, 16), group_ms=(1, 4, 16), bias_ms=(3, 8))


def check_mma(shapes, out_lines: list[str], groups=()) -> bool:
    """The decode-size MMA kernel (fp4_mma, heuristic knobs) against the float32 reference on the benchmark shapes:
    both formats, fp16 and bf16, M = 1, 2, 3, 5, 8 (bias at 3 and 8), and bit-for-bit repeatability of its split-K
    reduction; then the q/k/v and gate/up groups (NVFP4, bf16, M 1, 4, 8)."""
    from qerl_kernels.fp4_mma import fp4_gemm_mma
    return _check_kernel("mma", fp4_gemm_mma, shapes, groups, out_lines, formats=("nvfp4", "mxfp4"),
                         ms=(1, 2, 3, 5, 8), group_ms=(1, 4, 8), bias_ms=(3, 8))


def check_wgmma(shapes, out_lines: list[str], groups=()) -> bool:
    """The wgmma kernel (fp4_wgmma, default knobs) against the float32 reference on the benchmark shapes: NVFP4,
    bf16 and fp16, M = 1, 16, 64, 128, 200, 256, 512 (bias at 200: two M blocks, the last ragged), bit-for-bit
    repeatability of its stream-K reduction; then the q/k/v and gate/up groups (bf16, M 16, 128, 300)."""
    from qerl_kernels.fp4_wgmma import fp4_gemm_wgmma
    return _check_kernel("wgmma", fp4_gemm_wgmma, shapes, groups, out_lines, formats=("nvfp4",),
                         ms=(1, 16, 64, 128, 200, 256, 512), group_ms=(16, 128, 300), bias_ms=(200,))


def gemv_wins(rows, device: str, margin: float = 0.97) -> list[str]:
    """MEASURED_WINS entries (fp4_gemv) for the rows where nvfp4_gemv / mxfp4_gemv took at most `margin` times the
    default path's time (nvfp4 / mxfp4) on the same shape and M: Python lines to paste into that table, each with
    the two times. bf16 activations (the benchmark's); knobs {} = the heuristic's, which is what was timed."""
    from qerl_kernels.fp4_gemv import m_bucket
    t = {(r["model"], r["layer"], r["M"], r["method"]): r for r in rows}
    out, seen = [], set()
    for (model, layer, m, meth), r in sorted(t.items(), key=lambda kv: (kv[0][3], int(kv[1]["N"]), kv[0][2])):
        if not meth.endswith("_gemv"):
            continue
        base = t.get((model, layer, m, meth[:5]))
        if base is None:
            continue
        tg, tb = float(r["median_ms"]), float(base["median_ms"])
        key = (device, 0 if meth.startswith("nvfp4") else 1, "bf16", int(r["N"]), int(r["K"]), m_bucket(m))
        if tg <= margin * tb and key not in seen:
            seen.add(key)
            out.append(f"    {key!r}: {{}},  # {layer} M={m}: gemv {tg * 1e3:.1f} us, default {tb * 1e3:.1f} us")
    return out


def gpu_slug(name: str) -> str:
    for key in ("H200", "H100", "B200", "A100", "L40S", "L4"):
        if key in name:
            return key.lower()
    return name.replace("NVIDIA ", "").split()[0].lower()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", nargs="+", default=list(MODELS))
    ap.add_argument("--m", nargs="+", type=int, default=list(M_VALUES))
    ap.add_argument("--out", default=None, help="output folder (default results/measured/<gpu>)")
    ap.add_argument("--commit", default=None)
    ap.add_argument("--command", default=None, help="the command line to record in kernels.provenance.md")
    ap.add_argument("--no-check", action="store_true")
    ap.add_argument("--skip", nargs="*", default=[], help="methods not to time (e.g. nvfp4_gluon where its smoke "
                    "test failed); nvfp4_gluon also leaves the correctness checks")
    ap.add_argument("--gemv-checks-only", action="store_true", help="correctness checks of the decode-size kernels "
                    "(fp4_gemv, fp4_mma) only, not of every kernel (the lean device call of run_device.sh gemv)")
    ap.add_argument("--wgmma-checks-only", action="store_true", help="correctness checks of the wgmma kernel "
                    "(fp4_wgmma) only (the lean device call of run_device.sh wgmma)")
    ap.add_argument("--budget-s", type=float, default=1e9, help="stop measuring new shapes after this many seconds")
    ap.add_argument("--prewarm", type=int, default=0, help="compile all kernel variants first in N processes")
    ap.add_argument("--prewarm-only", action="store_true")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("qerl_kernels.bench needs a CUDA device", file=sys.stderr)
        return 2
    t0 = time.time()
    if args.prewarm:
        print(f"prewarm: {prewarm(args.prewarm):.0f} s", flush=True)
        if args.prewarm_only:
            return 0
    torch.manual_seed(0)
    props = torch.cuda.get_device_properties(0)
    out = Path(args.out or f"results/measured/{gpu_slug(props.name)}")
    out.mkdir(parents=True, exist_ok=True)
    try:
        import bitsandbytes as bnb
        bnb_version = bnb.__version__
    except Exception as e:  # noqa: BLE001
        bnb, bnb_version = None, f"not available ({type(e).__name__}: {e})"
    from qerl_kernels import fp4_launch
    lines: list[str] = []

    ceiling, ceilings = read_ceiling()
    mm_tflops = matmul_tflops()
    lines.append(f"memory-bandwidth ceiling (best of: " + "; ".join(f"{k} {v:.0f} GB/s" for k, v in ceilings.items()) +
                 f"): {ceiling:.0f} GB/s; bf16 8192^3 matmul: {mm_tflops:.0f} TFLOP/s")
    print(lines[-1], flush=True)

    shapes = {}  # (N, K, member shapes or None) -> [(model, layer)]; per model: its layers, then its groups
    for model in args.models:
        for layer, nk in layer_shapes(model).items():
            shapes.setdefault((*nk, None), []).append((model, layer))
        for grp, members in group_shapes(model).items():
            shapes.setdefault((sum(mn for mn, _ in members), members[0][1], members), []).append((model, grp))
    check_ok = True
    if not args.no_check:
        first = {key for key, users in shapes.items() if any(mdl == args.models[0] for mdl, _ in users)}
        singles = [(n, k) for n, k, mem in shapes if mem is None and (n, k, mem) in first]
        grouped = [mem for n, k, mem in shapes if mem is not None and (n, k, mem) in first]
        if not args.gemv_checks_only and not args.wgmma_checks_only:
            check_ok = check_correctness(singles, lines, grouped, gluon="nvfp4_gluon" not in args.skip)
        if "nvfp4_gemv" not in args.skip and min(args.m) <= 16 and not args.wgmma_checks_only:
            check_ok &= check_gemv(singles, lines, grouped)
        if "nvfp4_mma" not in args.skip and min(args.m) <= 8 and not args.wgmma_checks_only:
            check_ok &= check_mma(singles, lines, grouped)
        if "nvfp4_wgmma" not in args.skip and not args.gemv_checks_only:
            check_ok &= check_wgmma(singles, lines, grouped)

    rows = []
    methods_all = ["bf16", "nvfp4", "mxfp4", "nf4", "bf16_bwd", "nvfp4_bwd"]
    for (n, k, members), users in shapes.items():
        if time.time() - t0 > args.budget_s:
            lines.append(f"budget reached: skipped shape N={n} K={k}" + (" (group)" if members else ""))
            print(lines[-1], flush=True)
            continue
        sb = ShapeBench(n, k, props.L2_cache_size, bnb, members=members)
        measured = {}
        r = sb.run("nvfp4_dequantize", 0)
        measured[("nvfp4_dequantize", 0)] = r
        for m in args.m:
            meths = list(methods_all)
            if m <= 64:
                meths += ["nvfp4_gluon"]
            if m <= 16:
                meths += ["nvfp4_gemv", "mxfp4_gemv"]
            if m <= 8:
                meths += ["nvfp4_mma", "mxfp4_mma"]
            if m <= 512:
                meths += ["nvfp4_wgmma"]
            if m >= 64:
                meths += ["nvfp4_tc", "nvfp4_bwd_tc"]
            if m >= 128:
                meths += ["nvfp4_fused", "nvfp4_deq_cublas"]
            if 16 < m <= 256:
                meths += ["nvfp4_bwd_fused", "nvfp4_bwd_deq_cublas"]
            if 16 <= m <= 512:
                meths += ["nvfp4_bwd_wgmma"]
            for meth in meths:
                if meth in args.skip:
                    continue
                r = sb.run(meth, m)
                if r is not None:
                    measured[(meth, m)] = r
            msg = " ".join(f"{meth}={measured[(meth, m)][0] * 1e3:.1f}us" for meth in meths if (meth, m) in measured)
            print(f"N={n} K={k}{' group' if members else ''} M={m}: {msg}", flush=True)
        for (meth, m), (ms, mode, wb) in measured.items():
            act = (m * k + m * n) * 2
            flops = 2 * m * n * k
            for model, layer in users:
                rows.append(dict(model=model, layer=layer, N=n, K=k, M=m, method=meth, median_ms=f"{ms:.5f}",
                                 weight_bytes=wb, gbps=f"{(wb + act) / ms / 1e6:.1f}",
                                 pct_ceiling=f"{100 * (wb + act) / ms / 1e6 / ceiling:.1f}",
                                 tflops=f"{flops / ms / 1e9:.2f}", timing=mode))
        del sb
        torch.cuda.empty_cache()

    # speedups per row
    idx = {(r["model"], r["layer"], r["M"], r["method"]): float(r["median_ms"]) for r in rows}
    for r in rows:
        base = "bf16_bwd" if "_bwd" in r["method"] else "bf16"
        b = idx.get((r["model"], r["layer"], r["M"], base))
        nf = idx.get((r["model"], r["layer"], r["M"], "nf4"))
        t = float(r["median_ms"])
        r["speedup_vs_bf16"] = f"{b / t:.3f}" if b and r["M"] else ""
        r["speedup_vs_nf4"] = f"{nf / t:.3f}" if nf and r["M"] and "_bwd" not in r["method"] else ""
    fields = ["model", "layer", "N", "K", "M", "method", "median_ms", "weight_bytes", "gbps", "pct_ceiling", "tflops",
              "speedup_vs_bf16", "speedup_vs_nf4", "timing"]
    with open(out / "kernels.csv", "w", newline="") as f:
        wr = csv.DictWriter(f, fieldnames=fields)
        wr.writeheader()
        wr.writerows(rows)

    wins = gemv_wins(rows, gpu_slug(props.name))
    (out / "gemv-wins.txt").write_text(
        "# fp4_gemv.MEASURED_WINS entries from this run (gemv <= 0.97x the default path's time; bf16)\n" +
        "\n".join(wins) + "\n")
    lines.append(f"skinny-M kernel (fp4_gemv) faster than the default path by >= 3 %: {len(wins)} shape/M entries "
                 "(gemv-wins.txt)")
    lines.append("default dispatch chosen (n, k, M bucket, dtype, format, segmented, device): " +
                 "; ".join(f"{k}: {v}" for k, v in sorted(fp4_launch.dispatch_table().items(), key=str)))
    summary = summarize(rows, ceiling, args.models, args.m, lines)
    (out / "kernels.summary.md").write_text(summary)
    extra = {"bitsandbytes": bnb_version, "FUSED_MAX_M": str(fp4_launch.FUSED_MAX_M),
             "memory-bandwidth ceiling": f"{ceiling:.0f} GB/s (best of: " +
             "; ".join(f"{k} {v:.0f}" for k, v in ceilings.items()) + ")",
             "bf16 8192^3 matmul": f"{mm_tflops:.0f} TFLOP/s", "correctness checks": "pass" if check_ok else "FAIL",
             "wall time": f"{time.time() - t0:.0f} s"}
    (out / "kernels.provenance.md").write_text(
        "# Provenance of kernels.csv, kernels.summary.md, kernels.png\n\n| | |\n|---|---|\n" + provenance(args, extra) +
        "\n\nTiming: median of CUDA-event-timed CUDA-graph replays; each replay calls the op once per weight copy "
        "(enough copies to exceed 2.5x L2), so every call reads its weight from HBM.\n")
    try:
        plot(rows, args.models, out / "kernels.png")
    except Exception as e:  # noqa: BLE001
        print(f"plot failed: {e}", flush=True)
    print(summary, flush=True)
    return 0 if check_ok else 1


if __name__ == "__main__":
    sys.exit(main())
