"""Device memory of one decoder layer's seven NVFP4 QuantLinear layers at the paper's shapes (GPU): as loaded (the
storage layout), after the first CUDA forward (the kernels' prepared form only), and through the storage-layout op
with its prepared cache (both copies: what kernel iteration 1 held).

Why here and not in qerl_kernels/bench.py: it measures the torch layer (qerl.layers.QuantLinear) above the kernels,
and qerl_kernels imports nothing from qerl but the format spec (tests/test_dependencies.py).

Run (GPU): `python -m qerl.profiling.layer_memory --models 7B` (a developer tool; README "CLI").
"""
from __future__ import annotations

import argparse

import torch

from qerl.layers import QuantLinear, w4a16_linear
from qerl_kernels import fp4_launch
from qerl_kernels import nvfp4 as knv
from qerl_kernels.bench import MODELS, layer_shapes

__all__ = ["memory_report", "main"]


def memory_report(models) -> int:
    """Device bytes per weight of one decoder layer's 7 QuantLinear (NVFP4) layers: as loaded (storage layout),
    after the first CUDA forward (prepared form only), and through the storage-layout op with its prepared cache
    (both copies: what iteration 1 held)."""
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
        ws = sum(t.numel() * t.element_size() for pair in fp4_launch._WORKSPACE.values() for t in pair)
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


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m qerl.profiling.layer_memory", description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=list(MODELS), help="names of qerl_kernels.bench.MODELS")
    return memory_report(ap.parse_args(argv).models)


if __name__ == "__main__":
    raise SystemExit(main())
