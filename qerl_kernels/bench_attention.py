"""The decode step's attention at each count of key splits (qerl_kernels.decode.decode_attention: a split kernel and
a combine kernel that also computes o's LoRA down-products), against the count `decode.attention_splits` picks,
timed as CUDA-graph replays.

Why: the split count trades programs in flight against the combine's work, and where it pays changes with the
batch, the span, the kv heads and the GPU (issue 22, calls 78-79 on an H100 and the 7B shape: batch 1 fastest with
one 64-key block a split, batch 8 with 8 splits, 32-64 with 3; `attention_splits` follows them). Each op is captured
once per layer of the model, every layer with its own cache (28 x 2 x batch x 4 x span x 128 bf16 at 7B: more than
the L2, as in a step), and the replay is divided by the layer count: microseconds a layer as a decode step pays
them. Every split count is timed `passes` times, every second pass in reverse order, so that the machine's drift
shows.

Run (GPU): python -m qerl_kernels.bench_attention --arch 7B --batches 1 8 64 --spans 1024 2048 --passes 2 --md a.md
"""
from __future__ import annotations

import argparse

import torch

from qerl_kernels import decode
from qerl_kernels.bench import time_graph

__all__ = ["SHAPES", "sweep", "markdown", "main"]

#: query heads, kv heads, head size, layers, LoRA rank of o (its down-products are the combine kernel's)
SHAPES = {"7B": (28, 4, 128, 28, 32), "14B": (40, 8, 128, 48, 32), "32B": (40, 8, 128, 64, 32)}


def sweep(arch: str, batches, spans, splits, passes: int = 2, timer=time_graph, layers: int | None = None,
          device: str = "cuda") -> list[dict]:
    """Rows of {arch, batch, span, splits, rule (attention_splits' pick), us (each pass), max_diff (of the output and
    of t against the rule's)} for every batch, span and split count of `splits` (2 up to span / 64: one split has
    no combine kernel, so no t) and the rule's own count."""
    heads, kvh, d, n_layers, r = SHAPES[arch]
    n_layers = layers or n_layers
    out = []
    for b in batches:
        maxlen = max(spans) + 8
        g = torch.Generator(device=device).manual_seed(0)
        kc = [torch.randn(b, kvh, maxlen, d, device=device, generator=g).to(torch.bfloat16) for _ in range(n_layers)]
        vc = [torch.randn(b, kvh, maxlen, d, device=device, generator=g).to(torch.bfloat16) for _ in range(n_layers)]
        q = [torch.randn(b, heads, d, device=device, generator=g).to(torch.bfloat16) for _ in range(n_layers)]
        a = [(0.02 * torch.randn(r, heads * d, device=device, generator=g)).to(torch.bfloat16)
             for _ in range(n_layers)]
        valid = torch.ones(b, maxlen, dtype=torch.bool, device=device)
        first = torch.zeros(b, dtype=torch.int32, device=device)
        for span in spans:
            slot = torch.tensor([span - 1], device=device)
            rule = decode.attention_splits(b, kvh, span)

            def attend(i, ns):
                return decode.decode_attention(q[i], kc[i], vc[i], valid, slot, span, d ** -0.5, use_triton=True,
                                               splits=ns, first=first, lora_a=a[i])
            ref = attend(0, rule)
            counts = sorted({s for s in splits if 2 <= s <= span // 64} | ({rule} if rule > 1 else set()))
            rows = {ns: dict(arch=arch, batch=b, span=span, splits=ns, rule=rule, us=[]) for ns in counts}
            for ns in counts:
                o, t = attend(0, ns)
                diffs = [(o.float() - ref[0].float()).abs().max().item()]
                if ref[1] is not None:
                    diffs.append((t.float() - ref[1].float()).abs().max().item())
                rows[ns]["max_diff"] = max(diffs)
            for p in range(passes):
                for ns in counts if p % 2 == 0 else counts[::-1]:
                    us = timer(lambda ns=ns: [attend(i, ns) for i in range(n_layers)]) / n_layers
                    rows[ns]["us"].append(round(us, 2))
                    print(f"{arch} batch {b} span {span} pass {p} splits {ns}{' (rule)' if ns == rule else ''}: "
                          f"{us:.2f} us a layer", flush=True)
            out += list(rows.values())
    return out


def markdown(rows: list[dict]) -> str:
    """One line per (arch, batch, span): us a layer (the passes' range) per split count, the rule's marked *."""
    lines = ["| arch | batch | span | splits: us a layer (* the rule's) | fastest |", "|---|---|---|---|---|"]
    for key in dict.fromkeys((r["arch"], r["batch"], r["span"]) for r in rows):
        sub = [r for r in rows if (r["arch"], r["batch"], r["span"]) == key]
        cells = [f"{r['splits']}{'*' if r['splits'] == r['rule'] else ''}: {min(r['us']):.1f}-{max(r['us']):.1f}"
                 for r in sub]
        best = min(sub, key=lambda r: min(r["us"]))["splits"]
        lines.append(f"| {key[0]} | {key[1]} | {key[2]} | {'; '.join(cells)} | {best} |")
    return "\n".join(lines)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--arch", default="7B", choices=list(SHAPES))
    ap.add_argument("--batches", nargs="+", type=int, default=[1, 8, 64])
    ap.add_argument("--spans", nargs="+", type=int, default=[1024, 2048])
    ap.add_argument("--splits", nargs="+", type=int, default=[2, 3, 4, 8, 16, 32])
    ap.add_argument("--passes", type=int, default=2)
    ap.add_argument("--md", default=None, help="the table as Markdown, with the GPU's name")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("bench_attention: needs a CUDA GPU")
    md = markdown(sweep(args.arch, args.batches, args.spans, args.splits, args.passes))
    if args.md:
        with open(args.md, "w") as f:
            f.write(f"GPU: {torch.cuda.get_device_name()}, torch {torch.__version__}\n\n{md}\n")
    print(md)


if __name__ == "__main__":
    main()
