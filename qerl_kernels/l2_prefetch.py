"""Warm the GPU's L2 cache with a tensor's bytes ahead of the kernel that reads them, and a probe of what it buys.

Why (issue 22, item 3): at decode batch 1 a 7B step's NVFP4 GEMMs read ~131 MB a layer at ~48 % of the H100's read
ceiling, while between them the attention, norm and LoRA kernels (~20 us a layer, a few SMs busy) leave HBM idle.
If the next GEMM's weight is already in L2 when it starts, its loads hit L2 instead of HBM. `l2_prefetch` issues
PTX `prefetch.global.L2::evict_last` for every 128-byte line of a tensor: no data comes back to registers, so a few
CTAs issue megabytes of prefetches in microseconds and the lines arrive while other kernels run (on a side stream).

Measured (H100, kernels.notes.md calls 24-26): an L2-resident weight makes the 7B q/k/v, o and down launches at M = 1
~15 % faster (they are latency-bound: 9.6-11.7 us even from L2), but the decode engine prefetching them on a side
stream during the step was slower (4,095 -> 4,476 us a step at batch 1) and was reverted: this module is the probe.

The probe (`python -m qerl_kernels.l2_prefetch`, GPU) measures, per 7B weight at decode M = 1, the default 4-bit
GEMM's time with L2 flushed first ("cold"), with the weight prefetched just before it and a pause for the lines to
land ("prefetched"), and run twice in a row ("hot", where the weight fits in L2), plus the prefetch and pause's
own time; every time from CUDA-graph replays (a GEMM's time = a sequence with it minus the same without it).
"""
from __future__ import annotations

import argparse

import torch

from qerl_kernels.fp4_decoder import HAVE_TRITON

if HAVE_TRITON:
    import triton
    import triton.language as tl

    @triton.jit
    def _l2_prefetch_kernel(ptr, n_lines, sink_ptr, PER: tl.constexpr, BLOCK: tl.constexpr):
        """Program p prefetches lines [p * PER * BLOCK, ...) of 128 bytes each (PER rounds of BLOCK lines, one
        line per thread a round); the asm's dummy result is stored only for an impossible line index."""
        base = tl.program_id(0).to(tl.int64) * (PER * BLOCK)
        for i in tl.static_range(PER):
            lines = base + i * BLOCK + tl.arange(0, BLOCK)
            ok = lines < n_lines
            addr = ptr + tl.where(ok, lines, 0) * 128
            r = tl.inline_asm_elementwise("prefetch.global.L2::evict_last [$1];\n\tmov.u32 $0, 0;", "=r,l",
                                          [addr], dtype=tl.int32, is_pure=False, pack=1)
            tl.store(sink_ptr + tl.arange(0, BLOCK), r, mask=lines < 0)

__all__ = ["l2_prefetch", "main"]

_SINK: dict = {}


def l2_prefetch(t: torch.Tensor, *, ctas: int = 32) -> None:
    """Prefetch the bytes of CUDA tensor `t` (contiguous storage from its data pointer) into L2, evict-last; returns
    at once (the lines arrive asynchronously). A no-op for an empty tensor.

    Raises:
        ValueError: `t` is not a contiguous CUDA tensor.
    """
    if not t.is_cuda or not t.is_contiguous():
        raise ValueError(f"l2_prefetch: needs a contiguous CUDA tensor, got {t.device} contiguous={t.is_contiguous()}")
    nbytes = t.numel() * t.element_size()
    if nbytes == 0:
        return
    n_lines = -(-nbytes // 128)
    block = 256
    per = max(1, min(64, -(-n_lines // (ctas * block))))
    grid = -(-n_lines // (per * block))
    sink = _SINK.get(t.device)
    if sink is None:
        sink = _SINK[t.device] = torch.zeros(block, dtype=torch.int32, device=t.device)
    base = t.view(torch.uint8) if t.dtype != torch.uint8 else t
    _l2_prefetch_kernel[(grid,)](base, n_lines, sink, PER=per, BLOCK=block, num_warps=8)


def _probe(shapes: dict, pause_us: float) -> list[dict]:
    """Per weight, CUDA-graph replays of sequences that start by flushing L2 (writing 256 MB); each GEMM time is the
    difference between a sequence with it and the same sequence without it, so launch and flush costs cancel."""
    from qerl_kernels import fp4_launch, random_prepared
    from qerl_kernels.bench import time_graph

    dev = torch.device("cuda")
    flush = torch.empty(256 * 2**20, dtype=torch.uint8, device=dev)  # more than any L2
    cycles = int(pause_us * 1.7e3)  # ~1.7 GHz SM clock (H100 / H200 under load)
    rows = []
    for name, (n, k) in shapes.items():
        p, _, _ = random_prepared("nvfp4", n, k, seed=0, device=dev)
        x = torch.randn(1, k, device=dev, dtype=torch.bfloat16)
        for _ in range(3):
            fp4_launch.fp4_gemm(x, p)  # autotune / compile, dispatch choice

        def pre():
            l2_prefetch(p.words)
            l2_prefetch(p.scales)

        def seq(prefetch: bool, gemms: int):
            def fn():
                flush.zero_()
                if prefetch:
                    pre()
                    torch.cuda._sleep(cycles)
                for _ in range(gemms):
                    fp4_launch.fp4_gemm(x, p)
            return fn
        t = {(pf, g): time_graph(seq(pf, g)) for pf in (False, True) for g in (0, 1, 2)}
        res = {"cold": t[False, 1] - t[False, 0], "prefetched": t[True, 1] - t[True, 0],
               "hot": t[False, 2] - t[False, 1], "prefetch + pause": t[True, 0] - t[False, 0]}
        mb = (p.words.numel() * p.words.element_size() + p.scales.numel() * p.scales.element_size()) / 1e6
        row = dict(weight=name, N=n, K=k, MB=round(mb, 1), **{m: round(v, 1) for m, v in res.items()})
        print(row, flush=True)
        rows.append(row)
    return rows


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pause-us", type=float, default=30.0, help="pause after the prefetch (the lines land)")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("l2_prefetch: needs a CUDA GPU")
    shapes = {"q/k/v group": (4608, 3584), "o_proj": (3584, 3584), "down_proj": (3584, 18944),
              "gate/up group": (37888, 3584)}
    rows = _probe(shapes, args.pause_us)
    print(f"\nGPU: {torch.cuda.get_device_name()}, L2 {torch.cuda.get_device_properties(0).L2_cache_size >> 20} MiB, "
          "M = 1, us (CUDA-graph replays, bench.time_graph)\n")
    print("| weight | MB | cold | prefetched | hot | prefetch + pause |\n|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['weight']} | {r['MB']} | {r['cold']} | {r['prefetched']} | {r['hot']} | {r['prefetch + pause']} |")


if __name__ == "__main__":
    main()
