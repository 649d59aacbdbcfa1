"""The decode step's sampling alone: torch's ops (qerl.rl.sampling.gumbel_sample) against the fused Triton kernel
(qerl_kernels.decode.sample_gumbel), each captured in a CUDA graph and replayed, at the batch sizes and vocabularies
the engine meets (SmolLM2's 49,152, Qwen2.5's 152,064), without top-p (rollouts) and with the evaluations' 0.95. Its
numbers set qerl_kernels.decode.sample_gumbel_pays.

    python -m qerl.profiling.sampler_bench            (one GPU; prints one line per shape)
"""
from __future__ import annotations

import time

import torch

__all__ = ["SHAPES", "time_graph", "main"]

SHAPES = ((1, 152064), (8, 152064), (64, 152064), (256, 152064), (1, 49152), (16, 49152), (128, 49152))


def time_graph(fn, reps: int = 200) -> float:
    """Mean microseconds of one replay of `fn` captured in a CUDA graph (after 3 eager warm-up calls)."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    graph.replay()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(reps):
        graph.replay()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / reps * 1e6


def main() -> None:
    from qerl.rl.sampling import gumbel_sample
    from qerl_kernels.decode import sample_gumbel

    if not torch.cuda.is_available():
        raise SystemExit("qerl.profiling.sampler_bench times CUDA graphs: it needs a GPU")
    for b, v in SHAPES:
        logits = torch.randn(b, v, device="cuda", dtype=torch.bfloat16)
        seed = torch.tensor([1], dtype=torch.int64, device="cuda")
        step = torch.tensor([0], device="cuda")
        for top_p in (1.0, 0.95):
            torch_us = time_graph(lambda: gumbel_sample(logits, 0.6, top_p))
            fused_us = time_graph(lambda: sample_gumbel(logits, 0.6, seed, step, top_p))
            print(f"B {b} V {v} top_p {top_p}: torch ops {torch_us:.1f} us, fused {fused_us:.1f} us", flush=True)


if __name__ == "__main__":
    main()
