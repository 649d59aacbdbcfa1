"""The decode step's sampling alone: torch's ops (qerl.rl.sampling.gumbel_sample) against the fused Triton kernel
(qerl_kernels.decode.sample_gumbel), each captured in a CUDA graph and timed by qerl_kernels.bench.time_calls (median
replay), at the batch sizes and vocabularies the engine meets (SmolLM2's 49,152, Qwen2.5's 152,064), without top-p
(rollouts) and with the evaluations' 0.95. Its numbers set qerl_kernels.decode.sample_gumbel_pays.

    python -m qerl.profiling.sampler_bench            (one GPU; prints one line per shape)
"""
from __future__ import annotations

import torch

__all__ = ["SHAPES", "main"]

SHAPES = ((1, 152064), (8, 152064), (64, 152064), (256, 152064), (1, 49152), (16, 49152), (128, 49152))


def main() -> None:
    from qerl.rl.sampling import gumbel_sample
    from qerl_kernels.bench import time_calls
    from qerl_kernels.decode import sample_gumbel

    if not torch.cuda.is_available():
        raise SystemExit("qerl.profiling.sampler_bench times CUDA graphs: it needs a GPU")
    for b, v in SHAPES:
        logits = torch.randn(b, v, device="cuda", dtype=torch.bfloat16)
        seed = torch.tensor([1], dtype=torch.int64, device="cuda")
        step = torch.tensor([0], device="cuda")
        for top_p in (1.0, 0.95):
            torch_ms, _ = time_calls([lambda: gumbel_sample(logits, 0.6, top_p)])
            fused_ms, _ = time_calls([lambda: sample_gumbel(logits, 0.6, seed, step, top_p)])
            print(f"B {b} V {v} top_p {top_p}: torch ops {1e3 * torch_ms:.1f} us, fused {1e3 * fused_ms:.1f} us",
                  flush=True)


if __name__ == "__main__":
    main()
