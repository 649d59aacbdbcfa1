"""An eager launch of the Gluon kernels with the JIT's per-call work done once per specialization.

Why (issue 22, calls 99-102): an eager launch of a Gluon kernel through `kernel[grid](*args, **meta)` cost 100-270
us of host time on the H100 machine's CPU (call 102: 267.6 us a call back to back on the 7B o weight at M = 128,
whose GPU time is 28 us), where the backward runs eagerly (the GRPO update) and where the dispatch times its
candidates. Half of it was the JIT's run: binding 20-odd arguments, specializing each (`native_specialize_impl`),
building the cache key and looking the compiled kernel up. Here the compiled kernel is found by a key computed
from the arguments by the same rules, at a fraction of the cost, and launched directly (`CompiledKernel.run`, what
the JIT's run calls last).

The key is a superset of what Triton specializes on, so two launches with one key always run one binary: for an int its
value being 1 and divisible by 16 and its range (i32 / i64 / u64), for a float nothing (not specialized), for a tensor
its dtype and 16-byte alignment, for a TMA descriptor its dtype, block shape, layout, padding, column count and strides
(the row count varies with M and is a runtime value of the descriptor), for anything else its type and value, plus every
meta parameter, the device and the JIT's debug / instrumentation settings. The first launch of a key goes through the
JIT (compiling or finding the binary, launching it) and records the binary; a GPU test checks, for every kernel and M,
that the binary recorded is the one the JIT picks. A launch hook (`triton.knobs.runtime.launch_enter_hook`, e.g. a
profiler) sends every launch through the JIT, which calls it.
"""
from __future__ import annotations

import torch

try:   # the JIT's settings, read at every launch (imported once here, not on the launch path)
    from triton import knobs
except ImportError:  # pragma: no cover - no Triton: nothing here is ever launched
    knobs = None

__all__ = ["launch", "spec_key", "cached_launches"]

_COMPILED: dict = {}
_I32 = (-(2 ** 31), 2 ** 31)


def _spec(a):
    """The specialization-relevant facts of one argument (a superset of Triton's rules, see the module); a TMA
    descriptor's are kept on it (the weights' descriptors live as long as the weight: fp4_gluon.weight_descriptors)."""
    t = type(a)
    if t is int:
        return (a == 1, a % 16 == 0, 0 if _I32[0] <= a < _I32[1] else 1 if a < 2 ** 63 else 2)
    if t is torch.Tensor or isinstance(a, torch.Tensor):
        return (a.dtype, a.data_ptr() % 16 == 0)
    if t is bool or a is None:
        return a
    if t is float:
        return float
    facts = getattr(a, "_spec_facts", None)
    if facts is None:
        base = getattr(a, "base", None)
        if not (isinstance(base, torch.Tensor) and hasattr(a, "block_shape")):   # not a TensorDescriptor
            return (t, a)
        facts = a._spec_facts = (base.dtype, tuple(a.block_shape), a.layout, a.padding, tuple(a.shape[1:]),
                                 tuple(a.strides))
    return facts


def spec_key(kernel, args: tuple, meta: dict, device: int) -> tuple:
    """The cache key of one launch on `device` (see the module): the kernel, its meta parameters, each argument's
    facts, the device and the JIT's debug / instrumentation settings."""
    return (kernel, tuple(meta.items()), tuple(_spec(a) for a in args), device, knobs.runtime.debug,
            knobs.compilation.instrumentation_mode)


def launch(kernel, grid: int, args: tuple, meta: dict) -> None:
    """Launch the Gluon kernel `kernel` on a 1-D grid with positional `args` and `meta` (constexprs by name, and the
    launch options num_warps / maxnreg), as `kernel[(grid,)](*args, **meta)` would, reusing the compiled binary of
    an earlier launch with the same key (`spec_key`)."""
    if _hooked():
        kernel[(grid,)](*args, **meta)
        return
    device = torch.cuda.current_device()
    key = spec_key(kernel, args, meta, device)
    hit = _COMPILED.get(key)
    if hit is None:
        compiled = kernel[(grid,)](*args, **meta)  # the JIT's path: binds, compiles or finds, launches
        # the parameters after the positional ones, in signature order, with their defaults (the JIT passes every
        # parameter, constexprs included, to the launcher)
        tail = tuple((p.name, p.default) for p in kernel.params[len(args):])
        _COMPILED[key] = (compiled, tail)
        return
    compiled, tail = hit
    full = list(args)
    full.extend(meta[name] if name in meta else default for name, default in tail)
    stream = torch._C._cuda_getCurrentRawStream(device)   # what the JIT's driver asks for the current stream
    compiled.run(grid, 1, 1, stream, compiled.function, compiled.packed_metadata, None, None, None, *full)


def _hooked() -> bool:
    """Whether a launch hook is set: a non-empty HookChain (Triton 3.5+: the knobs are chains, empty by default) or
    a function (older Triton: None by default)."""
    return any(getattr(h, "calls", h) for h in (knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook))


def cached_launches() -> dict:
    """{key: compiled kernel} of the launches recorded so far (the GPU test compares them with the JIT's pick)."""
    return {key: compiled for key, (compiled, _) in _COMPILED.items()}
