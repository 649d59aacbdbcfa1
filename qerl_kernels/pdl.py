"""Programmatic dependent launch (PDL) for the decode step's kernels (issue 22, item 3).

Why: at batch 1 a 7B decode step is ~310 launches back to back, most of them a few microseconds of work, and each
pays its launch and the ramp of its first memory reads while the GPU drains the kernel before it. A launch made with
programmatic stream serialisation may start while the previous kernel on the stream is still running; the kernel
itself then waits (`griddepcontrol.wait`) until that kernel has finished and its writes are visible. Measured on an
H100 (issue 22, call 58, results/measured/h100/kernels/direct_call58/: a plain streaming read launched back to back
on rotating buffers inside a CUDA graph): 7.2 MB 4.4 -> 2.5 us a launch, 9.3 MB 5.0 -> 3.2, 38 MB 14.7 -> 13.2,
77 MB 27.5 -> 26.6 (2.9 TB/s, 92 % of the read ceiling, at every size); fp4_mma's o launch 9.2 -> 7.9 us.

The contract of a kernel launched with PDL (`launch_kw` adds PDL=True and the launch option): every program
calls `begin` (or, in Gluon, the same two instructions) before it reads anything an earlier kernel of the step
writes and before any store or atomic; only reads of what no kernel of the step writes (weights, LoRA factors,
norm weights) may come before the wait. Because a kernel completes only after its own wait returned, the wait
also covers every kernel before the previous one. Kernels launched without it (torch's, cuBLAS's) wait for the
previous kernel as usual.

Switch: QERL_PDL=0 turns it off; it is on for CUDA devices of compute capability 9.0+ with a Triton that has the
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
    """Whether launches on t's device use PDL (QERL_PDL unset or not 0, a CUDA device of compute capability 9.0+,
    the grid-dependency instructions present, not interpreting)."""
    if os.environ.get("QERL_PDL", "1") == "0" or not HAVE_GDC or not t.is_cuda or interpret_mode():
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
