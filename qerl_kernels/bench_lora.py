"""The decode step's LoRA down-products on a GPU: the split kernel (qerl_kernels.decode.rmsnorm_lora, lora_down)
against what it replaces (the norm kernel followed by cuBLAS, or cuBLAS alone), and down's fused with the MLP
activation (decode.silu_mul_lora) against silu_mul + lora_down, timed as CUDA-graph replays.

Why: at small decode batches cuBLAS runs t = x A^T (A: [R, hidden], a few hundred KB to ~1 MB) as a split-K GEMV and a
reduction, two launches of ~4-5 us and ~1.5 us (H200, results/measured/h200/step_trace.run9.md: 112 + 112 launches
per 7B step, ~0.69 of a 4.3 ms step at batch 1); the split kernel is one launch, fused with the norm where one
precedes it. Each op is captured once per layer of the model, every layer with its own factors and activations
(28 x 2.6 MB at 7B: more than the L2, so A is read from HBM as in a real step), and the graph's replay time is
divided by the layer count: microseconds per launch as a decode step pays them, launch gaps included.

Run (GPU): python -m qerl_kernels.bench_lora --rows 1 8 16 32 64 128 --splits 8 16 64 --out lora.json --md lora.md
An earlier version of the kernels on the same GPU: git show REV:qerl_kernels/decode.py > decode_before.py, then the
same command with --decode-file decode_before.py.
"""
from __future__ import annotations

import argparse
import json

import torch

from qerl_kernels import decode
from qerl_kernels.bench import load_module_file, time_graph

__all__ = ["SHAPES", "bench", "main", "use_decode"]

#: hidden size, intermediate size, stacked LoRA ranks (q/k/v: 3 x r, gate/up: 2 x r, o and down: r), layers
SHAPES = {
    "7B": dict(hidden=3584, inter=18944, r=32, layers=28),
    "SmolLM2-135M": dict(hidden=576, inter=1536, r=32, layers=30),
}


def _ops(shape: dict) -> dict:
    """{op: (K, RT, kind)}: the four LoRA down-products of a decoder layer (kind "norm": after the norm, "plain":
    alone), and down's again fused with the MLP activation (kind "silu": decode.silu_mul_lora against silu_mul +
    lora_down, the engine's batch-1 path before it)."""
    h, inter, r = shape["hidden"], shape["inter"], shape["r"]
    return {"norm + q/k/v": (h, 3 * r, "norm"), "o": (h, r, "plain"), "norm + gate/up": (h, 2 * r, "norm"),
            "down": (inter, r, "plain"), "silu + down": (inter, r, "silu")}


def _silu_op(a: list, r: int, rows: int, dev, g, dtype):
    """(replaced, fused(n), reference, result) of the "silu + down" op over the layers' down LoRA A factors `a`
    ([RT, K] each): per layer gate/up outputs and their LoRA t and B (rank r)."""
    n_layers, k = len(a), a[0].shape[1]
    y = [torch.randn(rows, 2 * k, device=dev, generator=g).to(dtype) for _ in range(n_layers)]
    t = [torch.randn(rows, 2 * r, device=dev, generator=g).to(dtype) for _ in range(n_layers)]
    b = [0.02 * torch.randn(2 * k, r, device=dev, generator=g).to(dtype) for _ in range(n_layers)]

    def base():
        for i in range(n_layers):
            m = decode.silu_mul(y[i][:, :k], y[i][:, k:], t[i], b[i], use_triton=True)
            decode.lora_down(m, a[i], use_triton=True)

    def fused(n=None):
        for i in range(n_layers):
            decode.silu_mul_lora(y[i][:, :k], y[i][:, k:], t[i], b[i], a[i], use_triton=True, splits=n)
    ref = decode.lora_down(decode.silu_mul(y[0][:, :k], y[0][:, k:], t[0], b[0], use_triton=True), a[0],
                           use_triton=True)
    got = decode.silu_mul_lora(y[0][:, :k], y[0][:, k:], t[0], b[0], a[0], use_triton=True)[1]
    return base, fused, ref, got


def bench(model: str, rows_list, splits_list, dtype=torch.bfloat16) -> list[dict]:
    """Rows of {model, op, rows, variant, us}: per op and row count, the replaced path ("norm + cuBLAS" / "cuBLAS"),
    the split kernel at its default split ("split") and at each of `splits_list` ("split/N")."""
    dev = torch.device("cuda")
    shape = SHAPES[model]
    n_layers = shape["layers"]
    g = torch.Generator(device=dev).manual_seed(0)
    out = []
    for op, (k, rt, kind) in _ops(shape).items():
        norm = kind == "norm"
        a = [0.02 * torch.randn(rt, k, device=dev, generator=g).to(dtype) for _ in range(n_layers)]
        w = [1 + 0.1 * torch.randn(k, device=dev, generator=g).to(dtype) for _ in range(n_layers)]
        for rows in rows_list:
            x = [torch.randn(rows, k, device=dev, generator=g).to(dtype) for _ in range(n_layers)]
            if kind == "silu":
                base, split, ref, got = _silu_op(a, shape["r"], rows, dev, g, dtype)
            elif norm:
                def base(x=x):
                    for i in range(n_layers):
                        xn = decode.rmsnorm(x[i], w[i], 1e-6, use_triton=True)
                        torch.nn.functional.linear(xn, a[i])
            else:
                def base(x=x):
                    for i in range(n_layers):
                        torch.nn.functional.linear(x[i], a[i])

            if kind != "silu":
                def split(n=None, x=x):
                    for i in range(n_layers):
                        if norm:
                            decode.rmsnorm_lora(x[i], w[i], 1e-6, a[i], use_triton=True, splits=n)
                        else:
                            decode.lora_down(x[i], a[i], use_triton=True, splits=n)
            # the split kernel's result against the replaced path (bf16 rounding of one product)
            if norm:
                ref = torch.nn.functional.linear(decode.rmsnorm(x[0], w[0], 1e-6, use_triton=True), a[0])
                got = decode.rmsnorm_lora(x[0], w[0], 1e-6, a[0], use_triton=True)[1]
            elif kind == "plain":
                ref, got = torch.nn.functional.linear(x[0], a[0]), decode.lora_down(x[0], a[0], use_triton=True)
            err = float((got.float() - ref.float()).norm() / ref.float().norm().clamp_min(1e-30))
            # bf16 rounding stays near 1e-3 (calls 15-17: 0 to 5.3e-4): a wrong kernel's timing is no measurement
            if not err < 1e-2:
                raise RuntimeError(f"bench_lora: the split kernel disagrees with the replaced path on {model} {op} "
                                   f"at {rows} rows: relative error {err:.2e}")
            replaced = {"norm": "norm + cuBLAS", "plain": "cuBLAS", "silu": "silu_mul + lora_down"}[kind]
            variants = [(replaced, base), ("split", split)]
            variants += [(f"split/{n}", lambda n=n: split(n)) for n in splits_list]
            for name, fn in variants:
                us = time_graph(fn) / n_layers
                row = dict(model=model, op=op, rows=rows, K=k, RT=rt, variant=name, us=round(us, 2),
                           rel_err=err if name == "split" else None)
                print(json.dumps(row), flush=True)
                out.append(row)
    return out


def use_decode(path: str) -> None:
    """Time the kernels of the decode module in source file `path` from now on (bench.load_module_file)."""
    global decode
    decode = load_module_file(path, "qerl_decode_alt")


def markdown(rows: list[dict]) -> str:
    """One table per model: op x rows, us per launch of each variant, and the default split's speed-up."""
    lines = []
    for model in dict.fromkeys(r["model"] for r in rows):
        sub = [r for r in rows if r["model"] == model]
        variants = list(dict.fromkeys(r["variant"] for r in sub))
        lines += [f"### {model} (us per layer, CUDA-graph replay)", "",
                  "| op | rows | " + " | ".join(variants) + " | replaced / split | rel err |",
                  "|---|---|" + "---|" * (len(variants) + 2)]
        for op, rows_n in dict.fromkeys((r["op"], r["rows"]) for r in sub):
            cell = {r["variant"]: r for r in sub if r["op"] == op and r["rows"] == rows_n}
            base = next(iter(cell.values()))["us"]  # the replaced path, timed first
            sp = cell["split"]["us"]
            lines.append(f"| {op} | {rows_n} | " + " | ".join(
                f"{cell[v]['us']:.2f}" if v in cell else "-" for v in variants)
                + f" | {base / sp:.2f} | {cell['split']['rel_err']:.1e} |")
        lines.append("")
    return "\n".join(lines)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    ap.add_argument("--rows", nargs="+", type=int, default=[1, 8, 16, 32, 64, 128])
    ap.add_argument("--splits", nargs="*", type=int, default=[8, 16, 64], help="other split counts to time")
    ap.add_argument("--out", default=None, help="JSON list of the rows")
    ap.add_argument("--md", default=None, help="Markdown tables")
    ap.add_argument("--decode-file", default=None,
                    help="time the kernels of this decode module instead (e.g. `git show REV:qerl_kernels/decode.py`: "
                         "an earlier version, for a before / after comparison on one GPU)")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("bench_lora: needs a CUDA GPU")
    if args.decode_file:
        use_decode(args.decode_file)
    rows = []
    for model in args.models:  # the files are rewritten after each model: a run cut short keeps what it measured
        rows += bench(model, args.rows, args.splits)
        md = markdown(rows)
        if args.out:
            with open(args.out, "w") as f:
                json.dump(dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, decode=args.decode_file,
                               rows=rows), f, indent=1)
        if args.md:
            src = f", decode module {args.decode_file}" if args.decode_file else ""
            with open(args.md, "w") as f:
                f.write(f"GPU: {torch.cuda.get_device_name()}, torch {torch.__version__}{src}\n\n{md}\n")
    print(md)


if __name__ == "__main__":
    main()
