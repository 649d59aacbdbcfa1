"""Compile the Gluon NVFP4 kernels (fp4_gluon.py, fp4_wgmma.py) ahead of time for a Hopper GPU, on any machine: no
GPU needed.

Why (issue 22): the kernel gets few GPU calls; a Gluon API, layout or ptxas error found there wastes one. Triton
compiles for a target it does not have (Gluon -> TTGIR -> LLVM -> PTX, then the backend's bundled ptxas -> cubin),
so this builds every variant the benchmark and the config sweep launch and reports, per variant, ok or the error,
registers per thread, spills and shared memory, how many CTAs per SM those resources allow against the CTAs per SM
the launch plans for, and how many layout conversions go through shared memory (stmatrix / ldmatrix; none expected).

How: each variant's launch is built by the launcher itself (fp4_gluon.launch_args) from CPU tensors of the real
shapes and dtypes, and goes through the JIT's own argument binding (its signature, constexprs and alignment / value
specialisations, e.g. M = 1 becomes a constant), so the check compiles exactly the binary a launch on the GPU would
build and, run on the GPU machine, fills Triton's cache with it. Registers and spills come from `ptxas -v` (the same
ptxas and architecture Triton used) on the compiled PTX; shared memory from the compiled kernel's metadata.

Variants (`variants()`): the benchmark's (default knobs; the 7B gate/up group at M = 1, 4, 8, 16, 32, 64, i.e. MP
8/16/32/64; down_proj, q, k/v and the q/k/v group, where the plan's integers specialise differently; bf16, plus fp16,
bias and a one-k-step weight as the tests launch them) and tune.py's GLUON_SWEEP (rows per tile with warps, ring
stages, CTAs per SM) at M = 1 and 16 on the gate/up group.

The wgmma kernel's variants (`wgmma_variants`: the 7B launch shapes at M = 16..512, fp16, bias, ragged M, the sweep's
knobs) also report what its design relies on (`wgmma_facts`): wgmma count and shape, A from registers, the waits,
commits and barriers in the PTX.

Run:  python -m qerl_kernels.gluon_compile                 # every variant, a table on stdout; exit 1 if any failed
      python -m qerl_kernels.gluon_compile --kernel wgmma --jobs 8   # only fp4_wgmma's, 8 builds at a time
      python -m qerl_kernels.gluon_compile --only bench-m1 tune-64-4-3-1-m16 --json   (--list names them)
Needs Triton with triton.experimental.gluon (3.6 on the GPU image; 3.9 builds it too).
"""
from __future__ import annotations

import argparse
import inspect
import json
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

import torch

from qerl_kernels import fp4_gluon, fp4_wgmma, fp4_wgmma_t
from qerl_kernels.layout import PreparedFP4, padded_shape

__all__ = ["Variant", "variants", "empty_prepared", "wgmma_variants", "wgmma_facts", "compile_variant", "ptxas_usage",
           "resident_ctas", "check", "table", "main"]

SMEM_PER_SM = 228 * 1024      # Hopper (H100 / H200): shared memory per SM
SMEM_RESERVED = 1024          # per CTA, reserved by the system
REGS_PER_SM = 65536
SMS = 132                     # H100 SXM; the plan (grid, PER) only changes the values of integer arguments
GATE_UP = (37888, 3584)       # the 7B gate/up group, N x K (the benchmark's and the sweep's largest launch)
DOWN = (3584, 18944)          # 7B down_proj (74 k-steps)


@dataclass(frozen=True)
class Variant:
    """One launch configuration of a Gluon kernel ("gluon": fp4_gemm_gluon, "wgmma": fp4_gemm_wgmma): a weight
    shape, M, activation dtype and bias, and the knobs."""
    name: str
    n: int
    k: int
    m: int
    bf16: bool = True
    bias: bool = False
    knobs: dict = field(default_factory=dict, hash=False)
    kernel: str = "gluon"


# the launcher and the kernel of each Gluon module this check builds
KERNELS = {"gluon": (fp4_gluon, "_fp4_gemm_ws"), "wgmma": (fp4_wgmma, "_fp4_gemm_wgmma"),
           "wgmma_t": (fp4_wgmma_t, "_fp4_gemm_t_wgmma")}
QKV, O_PROJ = (4608, 3584), (3584, 3584)     # the 7B q/k/v group and o_proj
WGMMA_MS = (16, 64, 128, 256, 512)          # the M the wgmma kernel is for (issue 22: RL batch sizes)


def variants(kernel: str = "gluon") -> list[Variant]:
    """The launches to build: for "gluon" the benchmark's (default knobs) and the tune sweep's (tune.GLUON_SWEEP; a
    sweep config equal to the defaults builds the same binary as its bench variant, then a cache hit); for "wgmma"
    `wgmma_variants`; "all" both."""
    if kernel == "wgmma":
        return wgmma_variants()
    if kernel == "wgmma_t":
        return wgmma_t_variants()
    if kernel == "all":
        return variants("gluon") + wgmma_variants() + wgmma_t_variants()
    from qerl_kernels.tune import GLUON_SWEEP
    out = [Variant(f"bench-m{m}", *GATE_UP, m) for m in (1, 4, 8, 16, 32, 64)]
    # other 7B shapes where the plan's integers specialise differently (k/v: one k-step per CTA, PER = 1 becomes a
    # constant; a 1-k-step weight as in the GPU tests: K_STEPS = 1 too)
    out += [Variant("bench-q-m1", 3584, 3584, 1), Variant("bench-kv-m1", 512, 3584, 1),
            Variant("bench-kv-m64", 512, 3584, 64), Variant("bench-qkv-m16", 4608, 3584, 16),
            Variant("test-k256-m9", 384, 256, 9)]
    out += [Variant("bench-down-m1", *DOWN, 1), Variant("bench-down-m16", *DOWN, 16),
            Variant("fp16-m1", *GATE_UP, 1, bf16=False), Variant("fp16-m16", *GATE_UP, 16, bf16=False),
            Variant("bias-m3", *GATE_UP, 3, bias=True), Variant("fp16-bias-m33", *GATE_UP, 33, bf16=False, bias=True)]
    for bn, nw, st, cps in GLUON_SWEEP:
        for m in (1, 16):
            out.append(Variant(f"tune-{bn}-{nw}-{st}-{cps}-m{m}", *GATE_UP, m,
                               knobs=dict(bn=bn, num_warps=nw, stages=st, ctas_per_sm=cps)))
    return out


def wgmma_variants() -> list[Variant]:
    """The wgmma kernel's builds (default knobs unless named): every 7B launch shape of the benchmark (q/k/v group,
    o_proj, gate/up group, down_proj) at M = 16, 64, 128, 256, 512 in bf16; fp16, bias, a ragged M (MP 32, 128 and
    M blocks of 256 with a ragged last block) and a one-k-step weight as the GPU tests launch them; one warpgroup
    (num_warps 4) and an M block of 256 (max_mp; spills) as the alternatives to time."""
    out = [Variant(f"wgmma-{name}-m{m}", *nk, m, kernel="wgmma")
           for name, nk in (("qkv", QKV), ("o", O_PROJ), ("gateup", GATE_UP), ("down", DOWN)) for m in WGMMA_MS]
    out += [Variant("wgmma-fp16-gateup-m64", *GATE_UP, 64, bf16=False, kernel="wgmma"),
            Variant("wgmma-fp16-bias-down-m200", *DOWN, 200, bf16=False, bias=True, kernel="wgmma"),
            Variant("wgmma-bias-qkv-m17", *QKV, 17, bias=True, kernel="wgmma"),
            Variant("wgmma-qkv-m300", *QKV, 300, kernel="wgmma"),
            Variant("wgmma-test-k256-m1", 384, 256, 1, kernel="wgmma"),
            Variant("wgmma-w4-gateup-m64", *GATE_UP, 64, knobs=dict(num_warps=4), kernel="wgmma"),
            Variant("wgmma-w4-gateup-m256", *GATE_UP, 256, knobs=dict(num_warps=4), kernel="wgmma"),
            Variant("wgmma-mp256-gateup-m256", *GATE_UP, 256, knobs=dict(max_mp=256), kernel="wgmma"),
            Variant("wgmma-mp256-ks32-gateup-m256", *GATE_UP, 256, knobs=dict(max_mp=256, ks=32), kernel="wgmma"),
            Variant("wgmma-ks32-gateup-m128", *GATE_UP, 128, knobs=dict(ks=32), kernel="wgmma"),
            Variant("wgmma-out2-gateup-m256", *GATE_UP, 256, knobs=dict(outstanding=2), kernel="wgmma"),
            Variant("wgmma-out2-ks32-gateup-m256", *GATE_UP, 256, knobs=dict(outstanding=2, ks=32), kernel="wgmma"),
            Variant("wgmma-out2-ks32-down-m256", *DOWN, 256, knobs=dict(outstanding=2, ks=32), kernel="wgmma")]
    # the rest of tune.WGMMA_SWEEP (gate/up group, M = 256), so the sweep's first GPU run finds them in the cache
    from qerl_kernels.tune import WGMMA_SWEEP
    named = {(8, 128, 64, None, None, 1), (4, 128, 64, None, None, 1), (8, 256, 64, None, None, 1),
             (8, 128, 64, None, None, 2), (8, 128, 32, None, None, 2)}
    for nw, mp, ks, ws, xs, o in WGMMA_SWEEP:
        if (nw, mp, ks, ws, xs, o) not in named:
            knobs = {k: v for k, v in dict(num_warps=nw, max_mp=mp, ks=ks, wstages=ws, xstages=xs).items()
                     if v is not None}
            if o != 1:
                knobs["outstanding"] = o
            tag = f"{nw}-{mp}-{ks}-{ws or 'd'}-{xs or 'd'}" + ("-o2" if o == 2 else "")
            out.append(Variant(f"wgmma-tune-{tag}-gateup-m256", *GATE_UP, 256, knobs=knobs, kernel="wgmma"))
    return out


def wgmma_t_variants() -> list[Variant]:
    """The backward wgmma kernel's builds (fp4_wgmma_t; `Variant.n, k` the weight's, M grad_y's rows): the 7B
    single weights the training step's backward takes (q, k/v, o, gate, down) at M = 16..512 in bf16 (default
    knobs: `fp4_wgmma_t.default_knobs`), fp16, a ragged M, a one-tile weight, and tune.WGMMA_T_SWEEP's knobs (128
    weight rows a step, M blocks of 128, 64 or 32, one consumer partition)."""
    shapes = (("q", O_PROJ), ("kv", (512, 3584)), ("gate", (18944, 3584)), ("down", DOWN))
    out = [Variant(f"wgmma_t-{name}-m{m}", *nk, m, kernel="wgmma_t") for name, nk in shapes for m in WGMMA_MS]
    out += [Variant("wgmma_t-fp16-gate-m64", 18944, 3584, 64, bf16=False, kernel="wgmma_t"),
            Variant("wgmma_t-down-m200", *DOWN, 200, kernel="wgmma_t"),
            Variant("wgmma_t-test-k256-m3", 384, 256, 3, kernel="wgmma_t"),
            Variant("wgmma_t-bnr128-gate-m256", 18944, 3584, 256, knobs=dict(bnr=128, max_mp=64), kernel="wgmma_t"),
            Variant("wgmma_t-mp64-gate-m256", 18944, 3584, 256, knobs=dict(bnr=64, max_mp=64), kernel="wgmma_t"),
            Variant("wgmma_t-bnr64-gate-m64", 18944, 3584, 64, knobs=dict(bnr=64, max_mp=64), kernel="wgmma_t"),
            Variant("wgmma_t-one-gate-m64", 18944, 3584, 64, knobs=dict(split=False), kernel="wgmma_t"),
            Variant("wgmma_t-split-mp64-gate-m256", 18944, 3584, 256, knobs=dict(split=True, max_mp=64),
                    kernel="wgmma_t"),
            Variant("wgmma_t-one-gate-m256", 18944, 3584, 256, knobs=dict(split=False), kernel="wgmma_t"),
            Variant("wgmma_t-bnr128-mp32-gate-m256", 18944, 3584, 256, knobs=dict(max_mp=32, bnr=128),
                    kernel="wgmma_t"),
            Variant("wgmma_t-shallow-gate-m64", 18944, 3584, 64, knobs=dict(bnr=64, wstages=4, gstages=3),
                    kernel="wgmma_t")]
    return out


def empty_prepared(n: int, k: int, scale_kind: int = 0) -> PreparedFP4:
    """A PreparedFP4 of n x k's padded shapes and dtypes from CPU tensors never filled: what an offline build needs
    (shapes, dtypes, strides and 16-byte alignment matter to the compile, values do not)."""
    n_pad, k_pad = padded_shape(n, k)
    return PreparedFP4(words=torch.empty(n_pad, k_pad // 8, dtype=torch.int32),
                       scales=torch.empty(n_pad, k_pad // 32, dtype=torch.int16 if scale_kind == 0 else torch.uint8),
                       out_scales=torch.empty(2, n_pad, dtype=torch.float32), n=n, k=k, scale_kind=scale_kind)


def _cpu_launch(v: Variant):
    """(grid, args, meta) of the variant's launch, built by its module's launch_args from CPU tensors (never
    filled: only shapes, dtypes, strides and 16-byte alignment matter to the compile)."""
    dt = torch.bfloat16 if v.bf16 else torch.float16
    w = empty_prepared(v.n, v.k)
    x = torch.empty(v.m, v.k, dtype=dt)
    y = torch.empty(v.m, v.n, dtype=dt)
    if v.kernel == "wgmma_t":   # grad_x [M, K] = grad_y [M, N] @ W
        return fp4_wgmma_t.launch_args(y, w, x, SMS, **v.knobs)
    bias = torch.empty(v.n, dtype=dt) if v.bias else None
    return KERNELS[v.kernel][0].launch_args(x, w, bias, y, SMS, **v.knobs)


def _target(arch: int):
    from triton.backends.compiler import GPUTarget
    return GPUTarget("cuda", arch, 32)


def compile_launch(kernel, args: tuple, kwargs: dict, arch: int = 90, gluon: bool = False):
    """triton.compile of one launch of a JIT kernel for `arch` without a GPU: the launch's arguments and keyword
    arguments (constexprs, num_warps, ...) through the JIT's own binding (signature, specialisations), as
    JITFunction.run does, then Gluon's or Triton's AST source. The shared step of gluon_compile, fp4_gemv's and
    decode_compile's offline checks. Raises what Triton raises."""
    import triton
    from triton import knobs
    from triton.compiler import ASTSource, make_backend
    from triton.runtime.jit import create_function_from_signature
    target = _target(arch)
    backend = make_backend(target)
    # the keyword arguments JITFunction.run adds before binding (the ones this Triton has)
    kwargs = dict(kwargs)
    kwargs.setdefault("debug", kernel.debug or knobs.runtime.debug)
    for k in ("instrumentation_mode", "fpsan_homomorphic_casts"):
        if hasattr(knobs.compilation, k):
            kwargs[k] = getattr(knobs.compilation, k)
    binder = create_function_from_signature(kernel.signature, kernel.params, backend)
    bound, specialization, options = binder(*args, **kwargs)
    options, signature, constexprs, attrs = kernel._pack_args(backend, kwargs, bound, specialization, options)
    if gluon:
        from triton.experimental.gluon._runtime import GluonASTSource
        src = GluonASTSource(kernel, signature, constexprs, attrs)
    else:
        src = ASTSource(kernel, signature, constexprs, attrs)
    return triton.compile(src, target=target, options=options.__dict__)


def compile_variant(v: Variant, arch: int = 90):
    """Compile the variant's launch for `arch` (no GPU); returns (CompiledKernel, meta). Raises what Triton raises."""
    _, args, meta = _cpu_launch(v)
    module, name = KERNELS[v.kernel]
    return compile_launch(getattr(module, name), args, meta, arch, gluon=True), meta


def ptxas_usage(ptx: str, metadata, arch: int = 90) -> dict:
    """`ptxas -v` of the PTX with the ptxas and the options Triton used for `arch` (line info, FMA fusion, extra
    ptxas options of the compiled kernel's metadata): registers, spill bytes, stack, warnings."""
    from triton.backends.nvidia.compiler import get_ptxas, sm_arch_from_capability
    opts = ["-lineinfo"] + ([] if metadata.enable_fp_fusion else ["--fmad=false"])
    opts += metadata.ptx_options.split() if metadata.ptx_options else []
    with tempfile.TemporaryDirectory() as d:
        src = f"{d}/k.ptx"
        with open(src, "w") as f:
            f.write(ptx)
        r = subprocess.run([get_ptxas(arch).path, *opts, "-v", f"--gpu-name={sm_arch_from_capability(arch)}", src,
                            "-o", f"{d}/k.cubin"], capture_output=True, text=True)
    log = r.stderr + r.stdout
    if r.returncode:
        raise RuntimeError(f"ptxas failed ({r.returncode}): {log[-2000:]}")

    def num(pattern):
        hit = re.search(pattern, log)
        return int(hit.group(1)) if hit else None
    return dict(regs=num(r"Used (\d+) registers"), spill_st=num(r"(\d+) bytes spill stores"),
                spill_ld=num(r"(\d+) bytes spill loads"), stack=num(r"(\d+) bytes stack frame"),
                warnings=[ln.strip() for ln in log.splitlines() if "warning" in ln.lower()],
                # ptxas's notes on wgmma (C75xx, "info", not warnings): serialised wgmma or a wait it had to insert
                # (e.g. "warpgroup.wait is injected ... to allow use of registers defined by GMMA"): the async
                # overlap the wgmma kernel is built on would be lost
                wgmma_notes=[ln.split(")", 1)[-1].strip() for ln in log.splitlines() if "(C75" in ln])


def resident_ctas(regs: int, threads: int, smem: int) -> int:
    """CTAs per SM that registers (allocated per warp in units of 256), shared memory and warps allow (Hopper)."""
    per_warp = -(-regs * 32 // 256) * 256
    by_regs = REGS_PER_SM // (per_warp * (threads // 32))
    by_smem = SMEM_PER_SM // (smem + SMEM_RESERVED)
    return min(by_regs, by_smem, 64 // (threads // 32), 32)


def check(v: Variant, arch: int = 90) -> dict:
    """Compile one variant; a row of the report (status 'ok' or the error's first line)."""
    module = KERNELS[v.kernel][0]
    defaults = inspect.signature(module.launch_args).parameters
    if v.kernel == "gluon":
        knobs = {k: defaults[k].default for k in ("bn", "num_warps", "stages")}
        knobs["ctas_per_sm"] = fp4_gluon.default_ctas_per_sm(v.m)
    elif v.kernel == "wgmma":   # one CTA per SM; BN and the two rings' depths follow from the knobs (read back)
        knobs = {k: defaults[k].default for k in ("num_warps", "max_mp", "ks")}
        knobs.update(ctas_per_sm=1, bn="-", stages="-")
    else:
        knobs = fp4_wgmma_t.default_knobs(v.m)
        knobs.update(ctas_per_sm=1, num_warps=fp4_wgmma_t.NUM_WARPS, bn="-", stages="-")
    knobs.update(v.knobs)
    row = dict(name=v.name, kernel=v.kernel, shape=f"{v.n}x{v.k}", m=v.m, dtype="bf16" if v.bf16 else "fp16",
               bias=v.bias, **knobs)
    t0 = time.time()
    try:
        compiled, meta = compile_variant(v, arch)
        use = ptxas_usage(compiled.asm["ptx"], compiled.metadata, arch)
    except Exception as e:  # noqa: BLE001 - reported per variant, the others still build
        while e.__cause__ is not None or e.__context__ is not None:   # the innermost error says what went wrong
            e = e.__cause__ or e.__context__
        lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
        row.update(status=f"{type(e).__name__}: {lines[0][:300] if lines else ''}", seconds=time.time() - t0)
        return row
    md = compiled.metadata
    threads = md.num_warps * 32
    ptx = compiled.asm["ptx"]
    row.update(status="ok", seconds=time.time() - t0, MP=meta["MP"], maxnreg=meta["maxnreg"], threads=threads,
               smem=md.shared, cubin=len(compiled.asm["cubin"]), **use,
               # instructions the design relies on, and layout conversions through shared memory (none expected)
               tma=ptx.count("cp.async.bulk.tensor"), mma=ptx.count("mma.sync"),
               smem_cvt=ptx.count("stmatrix") + ptx.count("ldmatrix"))
    if v.kernel == "wgmma":
        row.update(bn=meta["BN"], stages=f"{meta['WSTAGES']}/{meta['XSTAGES']}", **wgmma_facts(ptx),
                   **sass_loop_spills(compiled.asm["cubin"]))
    elif v.kernel == "wgmma_t":
        row.update(bn=meta["BNR"], stages=f"{meta['WSTAGES']}/{meta['GSTAGES']}", **wgmma_facts(ptx),
                   **sass_loop_spills(compiled.asm["cubin"]))
    row["fits"] = resident_ctas(use["regs"] or meta["maxnreg"], threads, md.shared)
    row["setmaxnreg"] = sorted({int(x) for x in re.findall(r"setmaxnreg\.\w+\.sync\.aligned\.u32\s+(\d+)", ptx)})
    return row


def wgmma_facts(ptx: str) -> dict:
    """What the wgmma kernel's design relies on, read from its PTX: the wgmma instructions and their shape, whether
    A comes from registers (operand 2 a register list, not a shared-memory descriptor), and the synchronisation
    the compiler emitted (static counts over the whole kernel; kernels.notes.md reads them per k-step)."""
    ops = re.findall(r"wgmma\.mma_async\.sync\.aligned\.(m64n\d+k16)\.f32\.(\w+)\.(\w+)\s+\{[^}]*\},\s*(\S)",
                     ptx)
    return dict(wgmma=len(ops), wgmma_shapes=sorted({f"{s}.{a}" for s, a, _, _ in ops}),
                wgmma_reg_a=sum(first == "{" for *_, first in ops),
                wgmma_wait=len(re.findall(r"wgmma\.wait_group", ptx)),
                wgmma_commit=len(re.findall(r"wgmma\.commit_group", ptx)),
                wgmma_fence=len(re.findall(r"wgmma\.fence", ptx)),
                mbar_wait=len(re.findall(r"mbarrier\.try_wait", ptx)),
                mbar_arrive=len(re.findall(r"mbarrier\.arrive", ptx)),
                bar_sync=len(re.findall(r"\b(?:bar|barrier)\.sync\b", ptx)))


def cuobjdump_sass(cubin: bytes) -> str | None:
    """The SASS text of a cubin, from the cuobjdump bundled with Triton's NVIDIA backend (or one on PATH); None
    where neither exists. The one place the offline checks read SASS (sass_loop_spills, decode_compile,
    fp4_mma)."""
    import os
    import shutil
    from triton.backends.nvidia import compiler as nv
    tool = os.path.join(os.path.dirname(nv.__file__), "bin", "cuobjdump")
    if not os.path.exists(tool):
        tool = shutil.which("cuobjdump")
        if tool is None:
            return None
    with tempfile.TemporaryDirectory() as d:
        with open(f"{d}/k.cubin", "wb") as f:
            f.write(cubin)
        return subprocess.run([tool, "-sass", f"{d}/k.cubin"], capture_output=True, text=True).stdout


def variants_main(argv, description: str, names, build, ok=lambda r: r["status"] == "ok") -> int:
    """The command line of an offline build (fp4_gemv, fp4_mma): `--only NAME ...` of `names`, one row a variant
    from `build(name)` as `key=value` words or, with --json, one JSON object a line; exit status 0 when every row is
    `ok`."""
    import argparse
    import json
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--only", nargs="*", default=None, help=f"variants (of {list(names)})")
    ap.add_argument("--json", action="store_true", help="one JSON object per line instead of a table")
    args = ap.parse_args(argv)
    rows = [build(v) for v in (args.only or names)]
    for r in rows:
        print(json.dumps(r) if args.json else " ".join(f"{k}={v}" for k, v in r.items()), flush=True)
    return 0 if all(ok(r) for r in rows) else 1


def sass_loop_spills(cubin: bytes) -> dict:
    """Where the wgmma kernel's spills are, from the SASS of the cubin Triton built (`cuobjdump_sass`): the
    local-memory loads / stores (STL / LDL) between the first HGMMA and the last `WARPGROUP.DEPBAR.LE gsb0, 0x1`
    (the wait that keeps one group in flight), i.e. inside the main loop, where they would cost every k-step,
    and outside it (the epilogue: once per tile). {} where cuobjdump is missing."""
    sass = cuobjdump_sass(cubin)
    if sass is None:
        return {}
    lines = sass.splitlines()
    mma = [i for i, ln in enumerate(lines) if "HGMMA" in ln]
    waits = [i for i, ln in enumerate(lines) if "DEPBAR.LE gsb0, 0x1" in ln]
    local = [i for i, ln in enumerate(lines) if re.search(r"\b(STL|LDL)(\.|\s)", ln)]
    if not mma or not waits:
        return dict(local_ops=len(local))
    inside = [i for i in local if mma[0] <= i <= waits[-1]]
    return dict(local_ops=len(local), loop_local_ops=len(inside))


def table(rows: list[dict]) -> str:
    """The report as a markdown table."""
    head = ("| variant | N x K | M | MP | dtype | bias | BN | warps | stages | CTAs/SM planned | fits | status | regs "
            "(maxnreg) | setmaxnreg | spill st/ld B | stack B | smem B | smem cvt | threads | wgmma (reg A) | "
            "bar.sync / mbarrier waits (static) | STL+LDL main loop / all (SASS) | s |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        ok = r["status"] == "ok"
        lines.append("| " + " | ".join(str(c) for c in (
            r["name"], r["shape"], r["m"], r.get("MP", "-"), r["dtype"], "y" if r["bias"] else "n", r["bn"],
            r["num_warps"], r["stages"], r["ctas_per_sm"], r.get("fits", "-") if ok else "-", r["status"],
            f"{r['regs']} ({r['maxnreg']})" if ok else "-", "/".join(map(str, r["setmaxnreg"])) if ok else "-",
            f"{r['spill_st']}/{r['spill_ld']}" if ok else "-", r["stack"] if ok else "-",
            r["smem"] if ok else "-", r["smem_cvt"] if ok else "-", r["threads"] if ok else "-",
            f"{r['wgmma']} ({r['wgmma_reg_a']}) {'/'.join(r['wgmma_shapes'])}" if ok and "wgmma" in r else "-",
            f"{r['bar_sync']} / {r['mbar_wait']}" if ok and "wgmma" in r else "-",
            f"{r['loop_local_ops']} / {r['local_ops']}" if ok and "loop_local_ops" in r else "-",
            f"{r['seconds']:.1f}")) + " |")
    warns = sorted({w for r in rows for w in r.get("warnings", [])})
    if warns:
        lines += ["", "ptxas warnings:"] + [f"- {w}" for w in warns]
    return "\n".join(lines)


def _check_star(a):
    return check(*a)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", nargs="*", default=None, help="variant names (default: all; --list shows them)")
    ap.add_argument("--list", action="store_true", help="print the variant names and exit")
    ap.add_argument("--kernel", choices=["gluon", "wgmma", "wgmma_t", "all"], default="all",
                    help="which kernel's variants: fp4_gluon's, fp4_wgmma's, fp4_wgmma_t's (the backward) or all "
                         "(default)")
    ap.add_argument("--jobs", type=int, default=1, help="build in this many processes (each variant is one build)")
    ap.add_argument("--arch", type=int, default=90, help="compute capability to build for (default 90: sm_90a)")
    ap.add_argument("--json", action="store_true", help="print one JSON object per variant instead of the table")
    args = ap.parse_args(argv)
    if not fp4_gluon.HAVE_GLUON:
        print("gluon_compile: this Triton has no triton.experimental.gluon with the Hopper modules", file=sys.stderr)
        return 2
    import triton
    vs = variants(args.kernel)
    if args.list:
        print("\n".join(v.name for v in vs))
        return 0
    if args.only is not None:
        unknown = set(args.only) - {v.name for v in vs}
        if unknown:
            print(f"gluon_compile: unknown variants {sorted(unknown)} (see --list)", file=sys.stderr)
            return 2
        vs = [v for v in vs if v.name in args.only]
    rows = []

    def emit(r):
        rows.append(r)
        if args.json:
            print(json.dumps(r), flush=True)
            return
        print(f"{r['name']}: {r['status']}" + (f" regs {r['regs']} spills {r['spill_st']}/{r['spill_ld']} smem "
                                               f"{r['smem']} fits {r['fits']}/{r['ctas_per_sm']} CTAs/SM"
                                               if r["status"] == "ok" else ""), flush=True)
    if args.jobs > 1:   # one process per build (a fresh one per task keeps each build's Triton state apart)
        import multiprocessing as mp
        with mp.get_context("spawn").Pool(args.jobs, maxtasksperchild=1) as pool:
            for r in pool.imap(_check_star, [(v, args.arch) for v in vs]):
                emit(r)
    else:
        for v in vs:
            emit(check(v, args.arch))
    if not args.json:
        print(f"\nGluon kernel compile check, triton {triton.__version__}, sm_{args.arch}\n\n{table(rows)}\n")
    bad = [r["name"] for r in rows if r["status"] != "ok"]
    print(f"{len(rows) - len(bad)} of {len(rows)} variants built" + (f"; failed: {' '.join(bad)}" if bad else ""),
          file=sys.stderr if args.json else sys.stdout)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
