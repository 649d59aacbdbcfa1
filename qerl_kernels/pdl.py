"""Programmatic dependent launch (PDL) for the decode step's kernels (issue 22, item 3): built, measured, off by
default (QERL_PDL=1 turns it on).

Why it was built: at batch 1 a 7B decode step is ~310 launches back to back, most of them a few microseconds of
work. A launch made with programmatic stream serialisation may start while the previous kernel on the stream is
still running; the kernel itself then waits (`griddepcontrol.wait`) until that kernel has finished and its writes
are visible, so its launch, and any reads of what no kernel of the step writes, overlap the previous kernel's tail.

Measured on an H100 (issue 22, results/measured/h100/kernels/direct_call58/ and pdl_call59/): a streaming read
launched back to back on rotating buffers inside a CUDA graph gains a lot (7.2 MB 4.4 -> 2.5 us a launch, 77 MB
27.5 -> 26.6), but that read waits only before its one store, so consecutive launches overlap entirely: a kernel
that consumes the previous one's output cannot. fp4_mma's o launch with its first weight unit loaded before the
wait: 9.2 -> 7.9 us. In the real 7B step (every decode kernel and 4-bit GEMM with it, call 59, graph replays): QeRL
3,950 us a step at batch 1 with PDL against 3,812 without (the stream-K GEMMs 2,219 against 2,129 us: their
persistent one-wave grids placed beside the previous kernel's CTAs), 4,611 against 4,602 at batch 8; the rollout
249.9 / 1,696 tok/s with it against 253.2 / 1,681 without. So it stays off.

The contract of a kernel launched with PDL (`launch_kw` adds PDL=True and the launch option): every program
calls `begin` (or, in Gluon, the same two instructions) before it reads anything an earlier kernel of the step
writes and before any store or atomic; only reads of what no kernel of the step writes (weights, LoRA factors,
norm weights) may come before the wait. Because a kernel completes only after its own wait returned, the wait
also covers every kernel before the previous one. Kernels launched without it (torch's, cuBLAS's) wait for the
previous kernel as usual.

Switch: QERL_PDL=1 turns it on for CUDA devices of compute capability 9.0+ with a Triton that has the
grid-dependency instructions; never under the interpreter.
"""
from __future__ import annotations

import functools
import os

import torch

from qerl_kernels.fp4_decoder import HAVE_TRITON
from qerl_kernels.layout import interpret_mode

HAVE_GDC = False
if HAVE_TRITON:
    import triton
    import triton.language as tl
    try:
        from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
        HAVE_GDC = True
    except ImportError:  # a Triton without them: PDL stays off
        pass

__all__ = ["enabled", "launch_kw", "HAVE_GDC"]


@functools.lru_cache(maxsize=None)
def _capable(index: int) -> bool:
    return torch.cuda.get_device_capability(index)[0] >= 9


def enabled(t: torch.Tensor) -> bool:
    """Whether launches on t's device use PDL (QERL_PDL=1, a CUDA device of compute capability 9.0+, the
    grid-dependency instructions present, not interpreting)."""
    if os.environ.get("QERL_PDL", "0") != "1" or not HAVE_GDC or not t.is_cuda or interpret_mode():
        return False
    return _capable(t.device.index if t.device.index is not None else torch.cuda.current_device())


def launch_kw(t: torch.Tensor) -> dict:
    """Extra launch arguments for a kernel with a `PDL` constexpr that follows the contract above: PDL=True and the
    launch option where `enabled(t)`, else {} (the kernel's default PDL=False)."""
    return dict(PDL=True, launch_pdl=True) if enabled(t) else {}


if HAVE_TRITON:
    @triton.jit
    def begin(PDL: tl.constexpr):
        """With PDL: let the next kernel launch, then wait for the previous one (its writes visible after this)."""
        if PDL:
            gdc_launch_dependents()
            gdc_wait()

    @triton.jit
    def trigger(PDL: tl.constexpr):
        """With PDL: let the next kernel launch (nothing waited for)."""
        if PDL:
            gdc_launch_dependents()

    @triton.jit
    def wait(PDL: tl.constexpr):
        """With PDL: wait for the previous kernel; every read of its outputs and every store comes after this."""
        if PDL:
            gdc_wait()
