"""Benchmark the FP4 W4A16 kernels on the linear layers of Qwen2.5-3B/7B/14B/32B, in one run.

Why: the kernels issue sets speed targets (7B shapes, one GPU, one run): at M = 1..16, >= 3.0x bf16 summed over a
decoder layer's GEMMs and >= 80% of the device-to-device copy bandwidth; >= 2x at M = 64; >= 0.9x at M >= 2048;
>= 5x bitsandbytes NF4 at M = 1; backward input gradient within 1.15x of bf16. This script measures every number
those targets need, plus the same for the other model sizes, and writes them with provenance.

What it times (median of CUDA-event-timed replays of a CUDA graph that runs the op once per weight copy; enough
copies that one pass over them exceeds the L2 cache, so every call streams its weight from HBM):
    bf16              F.linear(x, W_bf16)                       (cuBLAS)
    nvfp4 / mxfp4     kernels.fp4_gemm, default dispatch: fused kernel for M <= 64, dequantize + cuBLAS
                      above 512, in between whichever was faster when first timed
    nvfp4_fused       forced swap-AB kernel (M >= 128)
    nvfp4_deq_cublas  forced dequantize + cuBLAS (M >= 128)
    nvfp4_tc          forced tensor-core tiles, kernels._common.fp4_gemm_tc (M >= 64)
    nf4               bitsandbytes matmul_4bit, QLoRA settings (blocksize 64, double quant, bf16 compute)
    bf16_bwd          grad_y @ W_bf16                           (the backward input gradient)
    nvfp4_bwd         kernels.fp4_gemm_t (grad_y @ W), default dispatch: fused transposed kernel for M <= 64,
                      dequantize + cuBLAS above 256, in between whichever was faster when first timed
    nvfp4_bwd_fused / nvfp4_bwd_deq_cublas   the two backward paths forced (16 < M <= 256)
    nvfp4_bwd_tc      the backward through the tensor-core tiles (single weights, M >= 64)
    nvfp4_dequantize  the standalone dequantize kernel alone (M column = 0)
Groups (layers qkv_proj and gate_up_proj): q/k/v and gate/up as one weight each, NVFP4 members quantized one by one
and joined by kernels.concat_prepared (one launch), bf16 as one concatenated matrix; summed with o_proj and down_proj
into a 4-launch layer (GROUPED_LAYERS).
plus a device-to-device copy (HBM ceiling, bytes read + written) and an 8192^3 bf16 matmul.

Run (GPU):  python -m kernels.bench --out results/measured/h200 --commit $(git rev-parse HEAD)
Quick:      python -m kernels.bench --models 7B --m 1 16 2048 --out /tmp/b
Output: kernels.csv (one row per model, layer, M, method), kernels.summary.md (layer sums), kernels.png,
kernels.provenance.md (GPU, driver, torch, triton, bitsandbytes, commit, date, command).
"""
from __future__ import annotations

import argparse
import csv
import datetime
import math
import platform
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

# (hidden, intermediate, heads, kv_heads, head_dim) of the Qwen2.5 instruct models (config.json on the hub)
MODELS = {
    "3B": (2048, 11008, 16, 2, 128),
    "7B": (3584, 18944, 28, 4, 128),
    "14B": (5120, 13824, 40, 8, 128),
    "32B": (5120, 27648, 40, 8, 128),
}
M_VALUES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 2048, 8192)
LAYERS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def layer_shapes(model: str) -> dict[str, tuple[int, int]]:
    """{layer: (N, K)} of one decoder layer (weight [N, K], y = x @ W^T)."""
    h, inter, heads, kv, hd = MODELS[model]
    return {"q_proj": (heads * hd, h), "k_proj": (kv * hd, h), "v_proj": (kv * hd, h), "o_proj": (h, heads * hd),
            "gate_proj": (inter, h), "up_proj": (inter, h), "down_proj": (h, inter)}


GROUPS = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}
GROUPED_LAYERS = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")  # one layer with q/k/v and gate/up fused


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


def copies_for(nbytes: int, l2: int, cap: int = 256) -> int:
    """Weight copies so that one pass over them is at least 2.5x the L2 cache."""
    return int(min(cap, max(2, math.ceil(2.5 * l2 / max(nbytes, 1)))))


def copy_bandwidth(nbytes: int = 2 << 30) -> float:
    """Device-to-device copy, GB/s counting bytes read plus bytes written (median of 20)."""
    a = torch.empty(nbytes, dtype=torch.uint8, device="cuda").random_()
    b = torch.empty_like(a)
    t = time.time()
    while time.time() - t < 0.5:  # let clocks settle: an idle GPU starts at a low SM clock
        b.copy_(a)
        torch.cuda.synchronize()
    ms, _ = time_calls([lambda: b.copy_(a)], target_ms=200, max_reps=20)
    return 2 * nbytes / ms / 1e6


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
        from kernels import _common, mxfp4, nvfp4
        from kernels.reference import mxfp4_quantize_reference, nvfp4_quantize_reference

        self.n, self.k, self.dtype = n, k, dtype
        w = torch.randn(n, k, device="cuda") * 0.02
        self.w_bf16 = w.to(dtype)
        self.group = members is not None
        if self.group:
            rows = [0]
            for mn, _ in members:
                rows.append(rows[-1] + mn)
            self.nv_prepared = _common.concat_prepared(
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

    def run(self, method: str, m: int):
        """(ms per call, timing mode, weight bytes per call) for `method` at M = m; None if not applicable."""
        from kernels._common import fp4_dequantize, fp4_gemm, fp4_gemm_t

        if method not in self.copies and method[:5] in ("mxfp4", "nf4"):
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
        elif method in ("nvfp4_tc", "nvfp4_bwd_tc"):
            if method == "nvfp4_bwd_tc" and self.group:
                return None
            if method == "nvfp4_tc":
                fns = [lambda w=w: fp4_gemm(x, w, path="tc") for w in self.copies["nvfp4"]]
            else:
                fns = [lambda w=w: fp4_gemm_t(g, w, path="tc") for w in self.copies["nvfp4"]]
            wb = self.bytes["nvfp4"]
            try:
                fns[0]()
            except Exception as e:  # noqa: BLE001 - a config set that cannot compile here: report, go on
                print(f"{method} N={self.n} K={self.k} M={m}: {type(e).__name__}: {str(e)[:200]}", flush=True)
                return None
        elif method == "nvfp4_dequantize":
            fns = [lambda w=w: fp4_dequantize(w, self.dtype) for w in self.copies["nvfp4"]]
            wb = self.bytes["nvfp4"] + self.n * self.k * 2  # reads 4.5 bits, writes 16 bits per weight
        else:
            raise ValueError(f"unknown method {method!r}")
        ms, mode = time_calls(fns)
        return ms, mode, wb


def _clone_prepared(p):
    from kernels._common import PreparedFP4
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


# ---------------------------------------------------------------------------------------------------------------
def _prewarm_job(job) -> str:
    """Compile one kernel variant into Triton's on-disk cache (runs in a worker process)."""
    import torch
    from kernels import _common
    kind, cfg, sk, bf16, bias = job
    dt = torch.bfloat16 if bf16 else torch.float16
    variant = dict(SEGMENTED=False, HAS_LORA=False, R=16, HAS_RES=False)
    if kind in ("gemm_v", "tc_v"):  # the decode engine's variants: bias = (segmented, lora + residual)
        seg, lora_res = bias
        variant = dict(SEGMENTED=seg, HAS_LORA=lora_res, R=32, HAS_RES=lora_res)
        kind, bias = kind[:-2], kind == "tc_v" or False
    n, k, m = 512, 1024, 3
    words = torch.zeros(n, k // 8, dtype=torch.int32, device="cuda")
    scales = torch.zeros(n, k // 32, dtype=torch.int16 if sk == 0 else torch.uint8, device="cuda")
    osc = torch.ones(2, n, dtype=torch.float32, device="cuda")
    # optional operands as the real calls pass them (pointer dtypes are part of the compiled signature)
    seg_t = torch.zeros(n // 128, 3, dtype=torch.int64, device="cuda") if variant["SEGMENTED"] else osc
    t_t = torch.zeros(m, 96, dtype=dt, device="cuda") if variant["HAS_LORA"] else osc
    lb_t = torch.zeros(n, 32, dtype=dt, device="cuda") if variant["HAS_LORA"] else osc
    res_t = torch.zeros(m, n, dtype=dt, device="cuda") if variant["HAS_RES"] else osc
    if kind == "dequant":
        out = torch.empty(n, k, dtype=dt, device="cuda")
        _common._fp4_dequant.warmup(words, scales, osc, out, n, k, words.stride(0), scales.stride(0), out.stride(0),
                                    osc.stride(0), grid=(1,), SCALE_KIND=sk, BF16=bf16, USE_ASM=True, BN=64, BK=cfg,
                                    num_warps=4, num_stages=1)
        return f"dequant bk={cfg}"
    if kind == "gemm_t":  # bias stands for ROW_SCALE here
        g = torch.zeros(m, n, dtype=dt, device="cuda")
        o = torch.empty(m, k, dtype=dt, device="cuda")
        ws = torch.empty(1 << 16, dtype=torch.float32, device="cuda")
        cnt = torch.zeros(1 << 10, dtype=torch.int32, device="cuda")
        _common._fp4_gemm_t.warmup(g, words, scales, osc, o, ws, cnt, m, n, k, n, k, 16, g.stride(0),
                                   words.stride(0), scales.stride(0), o.stride(0), osc.stride(0), grid=(1,),
                                   SCALE_KIND=sk, BF16=bf16, USE_ASM=True, ROW_SCALE=bias, **cfg.kwargs,
                                   num_warps=cfg.num_warps, num_stages=cfg.num_stages)
        return f"gemm_t {cfg.kwargs}"
    if kind == "tc":  # bias stands for FORWARD here
        a = torch.zeros(m, k if bias else n, dtype=dt, device="cuda")
        o = torch.empty(m, n if bias else k, dtype=dt, device="cuda")
        _common._fp4_gemm_tc.warmup(a, words, scales, osc, osc, o, seg_t, t_t, lb_t, res_t, m, n if bias else k,
                                    k if bias else n, k if bias else n, n if bias else k, 128, a.stride(0),
                                    words.stride(0), scales.stride(0), o.stride(0), osc.stride(0), t_t.stride(0),
                                    res_t.stride(0), grid=(1,), SCALE_KIND=sk, BF16=bf16, HAS_BIAS=False, USE_ASM=True,
                                    FORWARD=bias, **variant, **cfg.kwargs,
                                    num_warps=cfg.num_warps, num_stages=cfg.num_stages)
        return f"tc {cfg.kwargs}"
    x = torch.zeros(m, k, dtype=dt, device="cuda")
    y = torch.empty(m, n, dtype=dt, device="cuda")
    b = torch.zeros(n, dtype=dt, device="cuda") if bias else osc
    ws = torch.empty(1 << 16, dtype=torch.float32, device="cuda")
    cnt = torch.zeros(1 << 10, dtype=torch.int32, device="cuda")
    kw = dict(cfg.kwargs)
    extra = {"maxnreg": cfg.maxnreg} if getattr(cfg, "maxnreg", None) else {}
    _common._fp4_gemm.warmup(x, words, scales, osc, b, y, ws, cnt, seg_t, t_t, lb_t, res_t, m, n, k, k, 16,
                             x.stride(0), words.stride(0), scales.stride(0), y.stride(0),
                             0 if variant["SEGMENTED"] else osc.stride(0), t_t.stride(0), res_t.stride(0), grid=(1,), SCALE_KIND=sk, BF16=bf16, HAS_BIAS=bias, USE_ASM=True,
                             EVEN_K=True, **variant, **kw,
                             num_warps=cfg.num_warps, num_stages=cfg.num_stages, **extra)
    return f"gemm {kw}"


def prewarm(processes: int, bias_variants=(False, True), dtypes=(True, False), configs=None, scale_kinds=(0, 1),
            dequant=True) -> float:
    """Compile every autotuning candidate (or `configs`) in parallel so later calls only load cached binaries."""
    import concurrent.futures as cf
    import multiprocessing as mp
    from kernels import _common
    t = time.time()
    configs = _common._gemm_configs() if configs is None else configs
    jobs = [("gemm", c, sk, bf, b) for c in configs for sk in scale_kinds for bf in dtypes for b in bias_variants]
    if dequant:
        jobs += [("dequant", bk, sk, bf, False) for bk in (128, 256) for sk in (0, 1) for bf in (True, False)]
        # backward kernel: bf16 (the training dtype), NVFP4 single weights and groups, MXFP4 single weights
        # tensor-core tiles: bf16, NVFP4 (the rollout and training dtype and format), both directions
        jobs += [("tc", c, 0, True, fwd) for c in _common._tc_configs() for fwd in (True, False)
                 if c.kwargs["TC_FWD" if fwd else "TC_BWD"]]
        # the decode engine's GEMM variants (NVFP4, bf16): segmented q/k/v and gate/up groups, o/down with LoRA +
        # residual in the epilogue
        for v in ((True, False), (False, True)):
            jobs += [("gemm_v", c, 0, True, v) for c in configs]
            jobs += [("tc_v", c, 0, True, v) for c in _common._tc_configs()
                     if c.kwargs["TC_FWD"] and (c.kwargs["BN"] <= 128 or not v[0])]
        jobs += [("gemm_t", c, sk, True, rs) for c in _common._gemm_t_configs() for sk, rs in
                 ((0, False), (0, True), (1, False))]
    with cf.ProcessPoolExecutor(processes, mp_context=mp.get_context("spawn")) as ex:
        for fut in cf.as_completed([ex.submit(_prewarm_job, j) for j in jobs]):
            try:
                fut.result()
            except Exception as e:  # noqa: BLE001 - a config that cannot compile is skipped by the autotuner too
                print(f"prewarm: {type(e).__name__}: {str(e)[:200]}", flush=True)
    return time.time() - t


def check_correctness(shapes, out_lines: list[str], groups=()) -> bool:
    """Every kernel against the float32 reference on every benchmark shape (fresh random weights and inputs).

    Forward (fused kernel), backward input gradient (fused transposed kernel), dequantize (bit-exact), both
    formats, fp16 and bf16; then the q/k/v and gate/up groups of the first model (forward and backward)."""
    from kernels._common import concat_prepared, fp4_dequantize, fp4_gemm, fp4_gemm_t
    from kernels.reference import (mxfp4_dequantize_reference, mxfp4_quantize_reference, nvfp4_dequantize_reference,
                                   nvfp4_quantize_reference)
    from kernels.reference import rel_error as rel
    from kernels import mxfp4, nvfp4

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


def memory_report(models) -> int:
    """Device bytes per weight of one decoder layer's 7 QuantLinear (NVFP4) layers: as loaded (storage layout),
    after the first CUDA forward (prepared form only), and through the storage-layout op with its prepared cache
    (both copies: what iteration 1 held)."""
    from kernels import nvfp4 as knv
    from qerl.layers import QuantLinear, w4a16_linear
    for model in models:
        shapes = layer_shapes(model)
        n_w = sum(n * k for n, k in shapes.values())
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        layers = [QuantLinear(k, n, bias=False, fmt="nvfp4", dtype=torch.bfloat16, device="cuda")
                  for n, k in shapes.values()]
        for q in layers:  # random codes and scales (the layout cost does not depend on the values)
            q.codes.random_(0, 256)
            q.scale_bits.copy_(torch.rand(q.scale_bits.shape, device="cuda").add(0.1).to(torch.float8_e4m3fn)
                               .view(torch.uint8))
        loaded = torch.cuda.memory_allocated() - base
        xs = {k: torch.randn(1, k, device="cuda", dtype=torch.bfloat16) for _, k in shapes.values()}
        for q in layers:
            q(xs[q.in_features])
        torch.cuda.synchronize()
        prepared = torch.cuda.memory_allocated() - base - sum(x.numel() * 2 for x in xs.values())
        dropped = sum(not any(n in q._buffers for n in ("codes", "scale_bits")) for q in layers)
        for q in layers:
            q.unprepare_kernels()
            w4a16_linear(xs[q.in_features], q.codes, q.scales, q.global_scale, fmt="nvfp4")
        torch.cuda.synchronize()
        both = torch.cuda.memory_allocated() - base - sum(x.numel() * 2 for x in xs.values())
        from kernels import _common
        ws = sum(t.numel() * t.element_size() for pair in _common._WORKSPACE.values() for t in pair)
        print(f"memory {model} layer ({n_w / 1e6:.1f}M weights): loaded {8 * loaded / n_w:.3f} bits/weight, "
              f"after the first CUDA forward {8 * prepared / n_w:.3f} (storage layout dropped in {dropped}/7 layers), "
              f"storage layout + cached prepared copy (iteration 1) {8 * both / n_w:.3f}; both figures include the "
              f"per-device stream-K workspace ({ws / 1e6:.1f} MB, allocated once for all layers, "
              f"{8 * ws / n_w:.3f} bits/weight of this one layer): without it {8 * (prepared - ws) / n_w:.3f} and "
              f"{8 * (both - ws) / n_w:.3f}", flush=True)
        del layers
        knv._CACHE.clear()
        torch.cuda.empty_cache()
    return 0


def gpu_slug(name: str) -> str:
    for key in ("H200", "H100", "B200", "A100", "L40S", "L4"):
        if key in name:
            return key.lower()
    return name.replace("NVIDIA ", "").split()[0].lower()


def provenance(args, extra: dict) -> str:
    props = torch.cuda.get_device_properties(0)
    try:
        driver = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                capture_output=True, text=True, timeout=20).stdout.strip()
    except Exception:  # noqa: BLE001
        driver = "unknown"
    import triton
    rows = {
        "GPU": f"{props.name} ({props.multi_processor_count} SMs, L2 {props.L2_cache_size >> 20} MiB, "
               f"{props.total_memory >> 30} GiB)",
        "driver": driver,
        "CUDA (torch)": torch.version.cuda,
        "torch": torch.__version__,
        "triton": triton.__version__,
        "python": platform.python_version(),
        "commit": args.commit or "unknown",
        "date (UTC)": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M"),
        "command": args.command or " ".join(sys.argv),
    }
    rows.update(extra)
    return "\n".join(f"| {k} | {v} |" for k, v in rows.items())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", nargs="+", default=list(MODELS))
    ap.add_argument("--m", nargs="+", type=int, default=list(M_VALUES))
    ap.add_argument("--out", default=None, help="output folder (default results/measured/<gpu>)")
    ap.add_argument("--commit", default=None)
    ap.add_argument("--command", default=None, help="the command line to record in kernels.provenance.md")
    ap.add_argument("--no-check", action="store_true")
    ap.add_argument("--budget-s", type=float, default=1e9, help="stop measuring new shapes after this many seconds")
    ap.add_argument("--prewarm", type=int, default=0, help="compile all kernel variants first in N processes")
    ap.add_argument("--prewarm-only", action="store_true")
    ap.add_argument("--memory", action="store_true", help="only report the device memory of one decoder layer's "
                    "QuantLinear layers per model (storage layout, prepared form, and the old cached second copy)")
    args = ap.parse_args(argv)
    if args.memory:
        return memory_report(args.models)
    if not torch.cuda.is_available():
        print("kernels.bench needs a CUDA device", file=sys.stderr)
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
    from kernels import _common
    lines: list[str] = []

    copy_gbs = copy_bandwidth()
    mm_tflops = matmul_tflops()
    lines.append(f"device-to-device copy: {copy_gbs:.0f} GB/s (read + write); bf16 8192^3 matmul: {mm_tflops:.0f} TFLOP/s")
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
        check_ok = check_correctness([(n, k) for n, k, mem in shapes if mem is None and (n, k, mem) in first], lines,
                                     [mem for n, k, mem in shapes if mem is not None and (n, k, mem) in first])

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
            if m >= 64:
                meths += ["nvfp4_tc", "nvfp4_bwd_tc"]
            if m >= 128:
                meths += ["nvfp4_fused", "nvfp4_deq_cublas"]
            if 16 < m <= 256:
                meths += ["nvfp4_bwd_fused", "nvfp4_bwd_deq_cublas"]
            for meth in meths:
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
                                 tflops=f"{flops / ms / 1e9:.2f}", timing=mode))
        del sb
        torch.cuda.empty_cache()

    # speedups per row
    idx = {(r["model"], r["layer"], r["M"], r["method"]): float(r["median_ms"]) for r in rows}
    for r in rows:
        base = "bf16_bwd" if r["method"].endswith("_bwd") else "bf16"
        b = idx.get((r["model"], r["layer"], r["M"], base))
        nf = idx.get((r["model"], r["layer"], r["M"], "nf4"))
        t = float(r["median_ms"])
        r["speedup_vs_bf16"] = f"{b / t:.3f}" if b and r["M"] else ""
        r["speedup_vs_nf4"] = f"{nf / t:.3f}" if nf and r["M"] and not r["method"].endswith("_bwd") else ""
    fields = ["model", "layer", "N", "K", "M", "method", "median_ms", "weight_bytes", "gbps", "tflops",
              "speedup_vs_bf16", "speedup_vs_nf4", "timing"]
    with open(out / "kernels.csv", "w", newline="") as f:
        wr = csv.DictWriter(f, fieldnames=fields)
        wr.writeheader()
        wr.writerows(rows)

    lines.append("default dispatch chosen (n, k, M bucket, dtype, format, segmented, device): " +
                 "; ".join(f"{k}: {v}" for k, v in sorted(_common.dispatch_table().items(), key=str)))
    summary = summarize(rows, copy_gbs, args.models, args.m, lines)
    (out / "kernels.summary.md").write_text(summary)
    extra = {"bitsandbytes": bnb_version, "FUSED_MAX_M": str(_common.FUSED_MAX_M),
             "device-to-device copy": f"{copy_gbs:.0f} GB/s (read + write)",
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


def layer_sums(rows, model, method, layers=LAYERS):
    """{M: summed ms over the launches `layers` of one decoder layer} (only where all were measured): the 7 GEMMs
    by default, GROUPED_LAYERS for the 4 launches with q/k/v and gate/up fused."""
    acc: dict[int, list[float]] = {}
    for r in rows:
        if r["model"] == model and r["method"] == method and r["layer"] in layers:
            acc.setdefault(r["M"], []).append(float(r["median_ms"]))
    return {m: sum(v) for m, v in acc.items() if len(v) == len(layers)}


def grouped_table(rows, copy_gbs, model) -> list[str]:
    """Layer sums with q/k/v and gate/up as one launch each, against bf16 unfused (the issue's definition) and
    bf16 with the same fusion (what an inference engine would run)."""
    bf7 = layer_sums(rows, model, "bf16")
    bf4, nv4 = layer_sums(rows, model, "bf16", GROUPED_LAYERS), layer_sums(rows, model, "nvfp4", GROUPED_LAYERS)
    nv7 = layer_sums(rows, model, "nvfp4")
    bb7, nb4 = layer_sums(rows, model, "bf16_bwd"), layer_sums(rows, model, "nvfp4_bwd", GROUPED_LAYERS)
    bb4, nb7 = layer_sums(rows, model, "bf16_bwd", GROUPED_LAYERS), layer_sums(rows, model, "nvfp4_bwd")
    if not nv4:
        return []
    wbytes = sum(int(r["weight_bytes"]) for r in rows if r["model"] == model and r["method"] == "nvfp4"
                 and r["layer"] in GROUPED_LAYERS and r["M"] == min(nv4))
    nweights = sum(int(r["N"]) * int(r["K"]) for r in rows if r["model"] == model and r["method"] == "nvfp4"
                   and r["layer"] in GROUPED_LAYERS and r["M"] == min(nv4))
    out = [f"## Qwen2.5-{model}, q/k/v and gate/up fused: 4 launches per layer (nvfp4 weights: "
           f"{8 * wbytes / nweights:.3f} bits per weight as held on the GPU)", "",
           "| M | bf16 7 GEMMs us | bf16 fused 4 GEMMs us | nvfp4 4 launches us | x bf16 (7) | x bf16 (fused) | "
           "nvfp4 weight GB/s | % copy BW | nvfp4 7 launches x bf16 | bwd nvfp4/bf16 (7) | bwd grouped nvfp4/bf16 fused |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
    for m in sorted(nv4):
        nv = nv4[m]
        gbs = wbytes / nv / 1e6
        cells = [str(m), f"{bf7[m] * 1e3:.1f}" if m in bf7 else "-", f"{bf4[m] * 1e3:.1f}" if m in bf4 else "-",
                 f"{nv * 1e3:.1f}", f"{bf7[m] / nv:.2f}" if m in bf7 else "-", f"{bf4[m] / nv:.2f}" if m in bf4 else "-",
                 f"{gbs:.0f}", f"{100 * gbs / copy_gbs:.0f}%",
                 f"{bf7[m] / nv7[m]:.2f}" if m in bf7 and m in nv7 else "-",
                 f"{nb7[m] / bb7[m]:.2f}" if m in nb7 and m in bb7 else "-",
                 f"{nb4[m] / bb4[m]:.2f}" if m in nb4 and m in bb4 else "-"]
        out.append("| " + " | ".join(cells) + " |")
    return out + [""]


TARGETS = ((1, 16, 3.0), (64, 64, 2.5), (128, 128, 1.4), (256, 1 << 30, 1.0))  # issue 15: (M from, to, x bf16)
BWD_TARGET = 1.1  # backward: nvfp4 / bf16 time at most this, every M


def targets_table(rows, model) -> list[str]:
    """Issue 15's kernel targets per M: the 7-GEMM layer sum against bf16's 7 GEMMs, and q/k/v + gate/up grouped
    (4 launches) against bf16 grouped the same way; the backward as nvfp4 / bf16 time (7 GEMMs)."""
    bf7, nv7 = layer_sums(rows, model, "bf16"), layer_sums(rows, model, "nvfp4")
    bf4, nv4 = layer_sums(rows, model, "bf16", GROUPED_LAYERS), layer_sums(rows, model, "nvfp4", GROUPED_LAYERS)
    bb, nb = layer_sums(rows, model, "bf16_bwd"), layer_sums(rows, model, "nvfp4_bwd")
    if not nv7:
        return []
    out = [f"## Issue 15 targets, Qwen2.5-{model} (forward: x bf16, higher is better; backward: nvfp4/bf16 time)", "",
           "| M | target fwd | fwd 7 GEMMs | fwd grouped (4 vs 4) | met? | bwd nvfp4/bf16 | bwd met (<= 1.1)? |",
           "|---|---|---|---|---|---|---|"]
    for m in sorted(nv7):
        tgt = next((t for lo, hi, t in TARGETS if lo <= m <= hi), None)
        f7 = bf7[m] / nv7[m] if m in bf7 else None
        f4 = bf4[m] / nv4[m] if m in bf4 and m in nv4 else None
        best = max(v for v in (f7, f4) if v is not None) if (f7 or f4) else None
        b = nb[m] / bb[m] if m in nb and m in bb else None
        out.append(f"| {m} | {'>= %.1f' % tgt if tgt else '-'} | {f7:.2f} | {f'{f4:.2f}' if f4 else '-'} | "
                   f"{'-' if tgt is None or best is None else ('yes' if best >= tgt else 'no')} | "
                   f"{f'{b:.2f}' if b else '-'} | {'-' if b is None else ('yes' if b <= BWD_TARGET else 'no')} |")
    return out + [""]


def summarize(rows, copy_gbs, models, ms, lines) -> str:
    out = ["# FP4 W4A16 kernels: layer sums", "", *[f"- {l}" for l in lines], ""]
    for model in models:
        out += targets_table(rows, model)
    for model in models:
        out += grouped_table(rows, copy_gbs, model)
    for model in models:
        bf = layer_sums(rows, model, "bf16")
        if not bf:
            continue
        wbytes = {}
        for meth in ("nvfp4", "mxfp4"):
            wbytes[meth] = sum(int(r["weight_bytes"]) for r in rows if r["model"] == model and r["method"] == meth
                               and r["M"] == min(bf) and r["layer"] in LAYERS)
        out += [f"## Qwen2.5-{model} (7 GEMMs of one decoder layer, summed)", "",
                "| M | bf16 us | nvfp4 us | x bf16 | nvfp4 weight GB/s | % copy BW | mxfp4 x bf16 | nf4 us | "
                "nvfp4 x nf4 | bwd nvfp4/bf16 | fused x bf16 | deq+cuBLAS x bf16 | tc x bf16 | bwd tc/bf16 |",
                "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        sums = {meth: layer_sums(rows, model, meth) for meth in
                ("nvfp4", "mxfp4", "nf4", "bf16_bwd", "nvfp4_bwd", "nvfp4_fused", "nvfp4_deq_cublas", "nvfp4_tc",
                 "nvfp4_bwd_tc")}
        for m in sorted(bf):
            nv = sums["nvfp4"].get(m)
            cells = [str(m), f"{bf[m] * 1e3:.1f}"]
            cells.append(f"{nv * 1e3:.1f}" if nv else "-")
            cells.append(f"{bf[m] / nv:.2f}" if nv else "-")
            gbs = wbytes["nvfp4"] / nv / 1e6 if nv else None
            cells.append(f"{gbs:.0f}" if gbs else "-")
            cells.append(f"{100 * gbs / copy_gbs:.0f}%" if gbs else "-")
            mx = sums["mxfp4"].get(m)
            cells.append(f"{bf[m] / mx:.2f}" if mx else "-")
            nf = sums["nf4"].get(m)
            cells.append(f"{nf * 1e3:.1f}" if nf else "-")
            cells.append(f"{nf / nv:.2f}" if nf and nv else "-")
            bb, nb = sums["bf16_bwd"].get(m), sums["nvfp4_bwd"].get(m)
            cells.append(f"{nb / bb:.2f}" if bb and nb else "-")
            fu, dq = sums["nvfp4_fused"].get(m), sums["nvfp4_deq_cublas"].get(m)
            cells.append(f"{bf[m] / fu:.2f}" if fu else "-")
            cells.append(f"{bf[m] / dq:.2f}" if dq else "-")
            tc, btc = sums["nvfp4_tc"].get(m), sums["nvfp4_bwd_tc"].get(m)
            cells.append(f"{bf[m] / tc:.2f}" if tc else "-")
            cells.append(f"{btc / bb:.2f}" if btc and bb else "-")
            out.append("| " + " | ".join(cells) + " |")
        out.append("")
    return "\n".join(out) + "\n"


def plot(rows, models, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(models), figsize=(4.2 * len(models), 3.6), squeeze=False)
    for ax, model in zip(axes[0], models):
        bf = layer_sums(rows, model, "bf16")
        for meth, style in (("nvfp4", "o-"), ("mxfp4", "s--"), ("nf4", "^:"), ("nvfp4_bwd", "x-.")):
            s = layer_sums(rows, model, meth)
            base = layer_sums(rows, model, "bf16_bwd") if meth.endswith("_bwd") else bf
            ms = sorted(m for m in s if m in base and m > 0)
            if ms:
                ax.plot(ms, [base[m] / s[m] for m in ms], style, label=meth)
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("M (tokens)")
        ax.set_title(f"Qwen2.5-{model}: speedup over bf16")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("x bf16 (layer sum)")
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120, metadata={"Software": None})  # no tool URL in the file


if __name__ == "__main__":
    sys.exit(main())
