"""Peak memory of this process, as every stage records it: the CUDA allocator's peak when CUDA is available, else the
host's maximum resident set size.

Why one function: training metrics (peak_memory_bytes per step), the quantization stage's layer_errors.json, the
evaluation results and the prepared model's prepare_info.json all report the same reading, so the paper-scale run
gives each stage's peak in one unit. Snakemake's benchmark files (R/benchmarks/) add the host's max_rss per job.

    from qerl.memory import peak_memory_bytes
    record["peak_memory_bytes"] = peak_memory_bytes()
"""
from __future__ import annotations

import resource

__all__ = ["peak_memory_bytes"]


def peak_memory_bytes() -> int:
    """torch.cuda.max_memory_allocated() when CUDA is available, else the host max RSS of this process, in bytes."""
    import torch

    if torch.cuda.is_available():
        return int(torch.cuda.max_memory_allocated())
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024
