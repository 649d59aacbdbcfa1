"""Programmatic dependent launch (PDL) for the decode step's kernels: the next kernel starts while this one ends.

Why (issue 22, item 3): at decode batch 1 a 7B step is ~370 short kernels (12-13 a layer), and each pays a fixed
cost at its edges, inside a CUDA graph too: its CTAs are launched only when the previous kernel has completed and
its memory is flushed, and its first loads then wait a full HBM latency. The step trace (kernels.notes.md, call 16)
puts 4,000 us of kernels in a 4,058 us graph replay, so the gaps are not between the kernels but at their two ends:
a launch ramp, a tail where a few CTAs finish alone. On Hopper a kernel launched with the programmatic-stream-
serialization attribute (Triton: `launch_pdl=True`) may start once every CTA of the previous kernel has executed
`griddepcontrol.launch_dependents` (or exited); it must then execute `griddepcontrol.wait` before it touches
anything the previous kernel writes, and that wait returns once the previous grid has completed and its writes are
visible. Between launch and wait it may read what no kernel of the step writes: the 4-bit weights, which the GEMMs
here fetch (into registers or L2) before the wait, so the weight stream of one kernel overlaps the tail of the last.

The rule every kernel with a `PDL` flag keeps: `launch_dependents(PDL)` first, reads of step-invariant data only,
then `wait(PDL)` before any read or write of activations, workspaces or counters, and always a wait before exit
(so that a kernel's completion implies its predecessors', as the chain's later kernels assume). With PDL off
(`QERL_PDL=0`, the interpreter, CPU, GPUs before Hopper, a Triton without the griddepcontrol ops) both helpers
compile to nothing and launches carry no attribute: the kernels and their results are the same (the same bits:
tests/qerl_kernels/test_decode.py and the engine tests run both ways on a GPU).

Measured: kernels.notes.md (calls 29 onwards) and results/measured/h100/kernels/.
"""
from __future__ import annotations

import functools
import os

import torch

from qerl_kernels.fp4_decoder import HAVE_TRITON
from qerl_kernels.layout import interpret_mode

__all__ = ["HAVE_GDC", "enabled", "launch_kwargs", "wait", "launch_dependents", "prefetch_l2"]

HAVE_GDC = False
if HAVE_TRITON:
    import triton
    import triton.language as tl
    try:
        from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
        HAVE_GDC = True
    except ImportError:  # a Triton before the griddepcontrol ops: PDL stays off
        pass

    @triton.jit
    def wait(PDL: tl.constexpr):
        """griddepcontrol.wait when PDL: returns once the previous kernel has completed, its writes visible."""
        if PDL:
            gdc_wait()

    @triton.jit
    def launch_dependents(PDL: tl.constexpr):
        """griddepcontrol.launch_dependents when PDL: the next kernel may launch once every CTA has run this."""
        if PDL:
            gdc_launch_dependents()

    @triton.jit
    def prefetch_l2(ptrs, mask, sink_ptr):
        """Prefetch the 128-byte lines at `ptrs` (where `mask`) into L2 (PTX prefetch.global.L2, no data back to
        registers). The asm's dummy result is stored under an impossible mask so that the compiler keeps it."""
        r = tl.inline_asm_elementwise("prefetch.global.L2 [$1];\n\tmov.u32 $0, 0;", "=r,l", [ptrs], dtype=tl.int32,
                                      is_pure=False, pack=1)
        tl.store(sink_ptr + r * 0, r, mask=mask & (r != 0))


def _env_on() -> bool:
    return os.environ.get("QERL_PDL", "1") not in ("", "0")


@functools.lru_cache(maxsize=None)
def _capable(index: int) -> bool:
    return torch.cuda.get_device_capability(index)[0] >= 9


def enabled(device: torch.device) -> bool:
    """Whether kernels launched on `device` now run with PDL: a Hopper-or-later CUDA GPU, compiled (not interpreted)
    Triton with the griddepcontrol ops, and QERL_PDL not "0" (read at every call: tests and benchmarks flip it)."""
    return (HAVE_GDC and device.type == "cuda" and _env_on() and not interpret_mode()
            and _capable(device.index if device.index is not None else torch.cuda.current_device()))


def launch_kwargs(device: torch.device) -> dict:
    """The meta-arguments that switch PDL on for one launch of a kernel with a `PDL` flag ({} when off)."""
    return {"PDL": True, "launch_pdl": True} if enabled(device) else {}
