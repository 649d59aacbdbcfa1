"""qkv_rope_cache at decode batch 1 on a GPU: the row-block path (tensor-core LoRA products over 16 rows, one real)
against the one-row path (decode.ROPE_ONE_ROW: float32 products summed over the rank, no shared-memory operand
conversions), timed as CUDA-graph replays over 28 layers of 7B-shaped inputs, with the two paths' outputs compared.

Why: the 7B step at batch 1 spends ~4.3 us a layer in this kernel (H100, kernels.notes.md call 37: 120 us of a 4.0 ms
step), and its SASS (qerl_kernels.decode_compile) issues 2 of its 44 loads before the first barrier on the row-block
path: each loaded tile is converted to the MMA layout through shared memory before the next load is issued. The
one-row path issues 23 of 58 before it. Which is faster is measured here; decode.ROPE_ONE_ROW follows (H100, issue 22
call 45: one row 1.85-2.03 us a launch, the row block 2.83, outputs identical: on).

Run (GPU): python -m qerl_kernels.bench_rope [--reps 2]
"""
from __future__ import annotations

import argparse

import torch

from qerl_kernels import decode
from qerl_kernels.bench import time_graph

__all__ = ["main"]


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=2, help="alternating timings of each path")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("bench_rope: needs a CUDA GPU")
    bf, dev = torch.bfloat16, "cuda"
    g = torch.Generator(device=dev).manual_seed(0)
    nq, nk, d, r, n_layers, max_len = 3584, 512, 128, 32, 28, 2048

    def rn(*s):
        return torch.randn(*s, device=dev, generator=g).to(bf)
    layers = []
    for _ in range(n_layers):
        y = rn(1, 1, nq + 2 * nk)
        layers.append((y[..., :nq], y[..., nq:nq + nk], y[..., nq + nk:], rn(1, 1, 3 * r), 0.3 * rn(nq + 2 * nk, r),
                       rn(nq + 2 * nk), rn(1, 4, max_len, d), rn(1, 4, max_len, d)))
    ang = torch.arange(max_len, device=dev)[:, None] * torch.rand(d // 2, device=dev, generator=g)[None, :]
    cos = torch.cat([ang.cos(), ang.cos()], -1).to(bf)
    sin = torch.cat([ang.sin(), ang.sin()], -1).to(bf)
    pos, slot = torch.tensor([[700]], device=dev), torch.tensor([700], device=dev)

    def call(layer, kc=None, vc=None):
        q, k, v, t, b, bias, kc0, vc0 = layer
        return decode.qkv_rope_cache(q, k, v, t, b, bias, cos, sin, pos, slot, kc0 if kc is None else kc,
                                     vc0 if vc is None else vc, use_triton=True)

    def run():
        for layer in layers:
            call(layer)
    keep = decode.ROPE_ONE_ROW
    try:
        outs = {}
        for one in (False, True):
            decode.ROPE_ONE_ROW = one
            kc, vc = layers[0][6].clone(), layers[0][7].clone()
            outs[one] = (call(layers[0], kc, vc).float(), kc.float(), vc.float())
        diff = max(((a - b).norm() / b.norm()).item() for a, b in zip(outs[True], outs[False]))
        print(f"GPU: {torch.cuda.get_device_name()}; one row vs row block: relative difference {diff:.1e}")
        for _ in range(args.reps):
            for one in (False, True):
                decode.ROPE_ONE_ROW = one
                print(f"{'one row' if one else 'row block'}: {time_graph(run) / n_layers:.2f} us a launch", flush=True)
    finally:
        decode.ROPE_ONE_ROW = keep


if __name__ == "__main__":
    main()
