"""Offline sm_90 builds of the decode step's Triton kernels (qerl_kernels.decode) at the 7B step's launches, on a
CPU machine: registers, spills, shared memory, SASS instructions, and the global loads a program issues before its
first barrier (`ldg_before_bar`).

Why the last: the decode step's small kernels are latency chains, and a load the compiler cannot move above a
barrier or an earlier store waits for it: the attention combine kernel with o's LoRA factors took 6.8 us a launch
with them loaded after its output's store and 4.2 us loaded first (H100, kernels.notes.md calls 36-37); the split
LoRA kernel's SiLU mode went 8.28 -> 7.42 us the same way (call 44). The SASS shows such an order without a GPU.

How: each launch is the wrapper's own (decode.rmsnorm_lora, decode_attention, ...) called on CPU tensors (never
filled) with `JITFunction.run` replaced by a recorder, so the arguments, constexprs and grid are exactly what the
engine launches; each recorded launch then goes through the JIT's binding and triton.compile for sm_90
(gluon_compile.compile_launch, as the GEMMs' checks do), `ptxas -v` for registers and spills
(gluon_compile.ptxas_usage), and the bundled cuobjdump for the SASS. Must run in a process where the Triton
interpreter has not run.

Run: python -m qerl_kernels.decode_compile [--rows 1 8] [--only NAME ...] [--json] [--split-lora]
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys

import torch

__all__ = ["launches", "record", "check", "main"]

#: Qwen2.5-7B's decode-step shapes (hidden, intermediate, heads, kv heads, head dim, LoRA rank, attention span)
SHAPE = dict(hidden=3584, inter=18944, heads=28, kv_heads=4, head_dim=128, rank=32, span=1024, sms=132)


def record(fn) -> list[tuple]:
    """Call fn() with every Triton launch recorded instead of run: [(kernel, grid, args, kwargs)]."""
    from triton.runtime.jit import JITFunction
    seen = []
    real = JITFunction.run

    def fake(self, *args, grid, warmup, **kwargs):
        seen.append((self, grid, args, kwargs))
    JITFunction.run = fake
    try:
        fn()
    finally:
        JITFunction.run = real
    return seen


def launches(rows: int, split_lora: bool = False) -> dict:
    """{name: fn} of the 7B step's decode-kernel calls at `rows` rows (bf16, CPU tensors), as the engine makes them:
    the norm with the q/k/v and gate/up LoRA down-products and the SiLU with down's up to each group's
    decode.lora_split_max_rows (the split kernel; at any rows with `split_lora`, to see what it would take there), the
    plain norm and SiLU above; RoPE + cache; the attention over SHAPE's span, its combine with o's factors."""
    from qerl_kernels import decode
    s, bf = SHAPE, torch.bfloat16
    h, i, d, r = s["hidden"], s["inter"], s["head_dim"], s["rank"]
    nq, nk = s["heads"] * d, s["kv_heads"] * d
    x = torch.empty(rows, 1, h, dtype=bf)
    w = torch.empty(h, dtype=bf)
    y = torch.empty(rows, 1, 2 * i, dtype=bf)
    t_gu = torch.empty(rows, 1, 2 * r, dtype=bf)
    b_gu = torch.empty(2 * i, r, dtype=bf)
    qkv = torch.empty(rows, 1, nq + 2 * nk, dtype=bf)
    cache = torch.empty(rows, s["kv_heads"], s["span"] + 8, d, dtype=bf)
    cos = torch.empty(s["span"] + 8, d, dtype=bf)
    pos = torch.zeros(rows, 1, dtype=torch.long)
    slot = torch.zeros(1, dtype=torch.long)
    q = torch.empty(rows, s["heads"], d, dtype=bf)
    valid = torch.ones(rows, s["span"] + 8, dtype=torch.bool)
    first = torch.zeros(rows, dtype=torch.int32)
    splits = decode.attention_splits(rows, s["kv_heads"], s["span"], s["sms"])
    out = {
        "qkv rope + cache": lambda: decode.qkv_rope_cache(
            qkv[..., :nq], qkv[..., nq:nq + nk], qkv[..., nq + nk:], torch.empty(rows, 1, 3 * r, dtype=bf),
            torch.empty(nq + 2 * nk, r, dtype=bf), torch.empty(nq + 2 * nk, dtype=bf), cos, cos, pos, slot, cache,
            cache, use_triton=True),
        "attention + combine with o's LoRA": lambda: decode.decode_attention(
            q, cache, cache, valid, slot, s["span"], d ** -0.5, use_triton=True, splits=splits, first=first,
            lora_a=torch.empty(r, nq, dtype=bf)),
    }
    limits = decode.lora_split_max_rows()

    def split(group):
        return split_lora or rows <= limits[group]

    if split("q/k/v"):
        out["norm + q/k/v LoRA"] = lambda: decode.rmsnorm_lora(x, w, 1e-6, torch.empty(3 * r, h, dtype=bf),
                                                               use_triton=True)
    if split("gate/up"):
        out["norm + gate/up LoRA"] = lambda: decode.rmsnorm_lora(x, w, 1e-6, torch.empty(2 * r, h, dtype=bf),
                                                                 use_triton=True)
    if not (split("q/k/v") and split("gate/up")):
        out["norm"] = lambda: decode.rmsnorm(x, w, 1e-6, use_triton=True)
    if split("down"):
        out["silu + down LoRA"] = lambda: decode.silu_mul_lora(y[..., :i], y[..., i:], t_gu, b_gu,
                                                               torch.empty(r, i, dtype=bf), use_triton=True)
    else:
        out["silu"] = lambda: decode.silu_mul(y[..., :i], y[..., i:], t_gu, b_gu, use_triton=True)
    return out


def sass_facts(cubin: bytes) -> dict:
    """SASS instructions, and the global loads (LDG) before the first barrier (BAR.SYNC), from the bundled
    cuobjdump (gluon_compile.cuobjdump_sass); {} where it is missing."""
    from qerl_kernels.gluon_compile import cuobjdump_sass
    sass = cuobjdump_sass(cubin)
    if sass is None:
        return {}
    ops = re.findall(r"/\*[0-9a-f]{4}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", sass)
    bar = next((j for j, op in enumerate(ops) if op.startswith("BAR.")), len(ops))
    return dict(sass=len(ops), ldg=sum(op.startswith("LDG") for op in ops),
                ldg_before_bar=sum(op.startswith("LDG") for op in ops[:bar]))


def check(name: str, rows: int, arch: int = 90, split_lora: bool = False) -> list[dict]:
    """Build every launch of one `launches` entry; a report row each (status 'ok' or the error's first line)."""
    from qerl_kernels.gluon_compile import compile_launch, ptxas_usage
    out = []
    for kernel, grid, args, kwargs in record(launches(rows, split_lora)[name]):
        row = dict(name=name, rows=rows, kernel=kernel.fn.__name__, grid=list(grid) if isinstance(grid, tuple)
                   else grid, num_warps=kwargs.get("num_warps", 4))
        try:
            compiled = compile_launch(kernel, args, kwargs, arch)
            use = ptxas_usage(compiled.asm["ptx"], compiled.metadata, arch)
        except Exception as e:  # noqa: BLE001 - reported per launch, the others still build
            lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
            row.update(status=f"{type(e).__name__}: {lines[0][:300] if lines else ''}")
            out.append(row)
            continue
        row.update(status="ok", regs=use["regs"], spill_st=use["spill_st"], spill_ld=use["spill_ld"],
                   smem=compiled.metadata.shared, **sass_facts(compiled.asm["cubin"]))
        out.append(row)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", nargs="+", type=int, default=[1, 8], help="decode rows (batch) of the launches")
    ap.add_argument("--only", nargs="*", default=None, help="launch names (default: all)")
    ap.add_argument("--arch", type=int, default=90, help="compute capability to build for (default 90)")
    ap.add_argument("--json", action="store_true", help="one JSON object per launch instead of the table")
    ap.add_argument("--split-lora", action="store_true", help="the split LoRA kernels at every --rows (the engine "
                    "runs them up to decode.lora_split_max_rows)")
    args = ap.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET") == "1":
        print("decode_compile: run it without TRITON_INTERPRET (the interpreter replaces the JIT)", file=sys.stderr)
        return 2
    known = {name for n in args.rows for name in launches(n, args.split_lora)}
    unknown = set(args.only or ()) - known
    if unknown:
        print(f"decode_compile: unknown launches {sorted(unknown)}; they are {sorted(known)}", file=sys.stderr)
        return 2
    rows = []
    for n in args.rows:
        for name in launches(n, args.split_lora):
            if args.only is None or name in args.only:
                rows += check(name, n, args.arch, args.split_lora)
    if args.json:
        for r in rows:
            print(json.dumps(r))
    else:
        cols = ["rows", "name", "kernel", "grid", "num_warps", "status", "regs", "spill_st", "smem", "sass", "ldg",
                "ldg_before_bar"]
        print("| " + " | ".join(cols) + " |\n|" + "---|" * len(cols))
        for r in rows:
            print("| " + " | ".join(str(r.get(c, "-")) for c in cols) + " |")
    return 1 if any(r["status"] != "ok" for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
