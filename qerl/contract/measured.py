"""The measured CSVs of `qerl profile` (results/measured/<gpu>/ and R/measured/<gpu>/): their columns, the key that
identifies one measurement, and what the report needs, stated once.

Why: the profiler wrote its header, the commit tool kept its own key per file, and the report listed the columns it
read; a renamed column would have broken one of them silently. Now the profiler writes `columns`, resumes and the
commit tool merges on `key`, and the report requires `required` (and reads `optional`, absent from files measured
before the column existed, as empty): all from one `MeasuredCsv` per file.

Cells are text: numbers, "OOM" where the measurement ran out of memory, "" where it does not apply.
No torch import. Run the tests: `pytest tests/test_contract.py -q`.
"""
from __future__ import annotations

from dataclasses import dataclass

__all__ = ["MeasuredCsv", "ROLLOUT", "E2E", "MEMORY", "ROLLOUT_HF", "MEASURED_CSVS"]


@dataclass(frozen=True)
class MeasuredCsv:
    """One measured CSV.

    Attributes:
        name: the file name in measured/<gpu>/.
        columns: the header `qerl profile` writes, in order.
        key: the columns that identify one measurement (a row with the same key is not measured again, and replaces
            the older one when a run is committed).
        required: the columns the report reads; a file without one of them is an error naming it.
        optional: columns the report reads when present.
    """

    name: str
    columns: tuple[str, ...]
    key: tuple[str, ...]
    required: tuple[str, ...]
    optional: tuple[str, ...] = ()


ROLLOUT = MeasuredCsv(
    "rollout.csv",
    columns=("model", "method", "rank", "batch", "tokens_per_s", "timing", "prompt_tokens", "completion_tokens",
             "prefill_s", "decode_s", "graphs", "capture_s"),
    key=("model", "method", "rank", "batch", "timing"),
    required=("model", "method", "rank", "batch", "tokens_per_s"))
E2E = MeasuredCsv(
    "e2e.csv",
    columns=("model", "method", "rank", "batch", "gradient_checkpointing", "step_s", "rollout_s", "logprob_s",
             "update_s", "peak_gb"),
    key=("model", "method", "batch", "gradient_checkpointing"),
    required=("model", "method", "batch", "gradient_checkpointing", "step_s"))
MEMORY = MeasuredCsv(
    "memory.csv",
    columns=("model", "method", "model_size_gb", "peak_gb", "batch", "gradient_checkpointing"),
    key=("model", "method"),
    required=("model", "method", "model_size_gb", "peak_gb"),
    optional=("batch", "gradient_checkpointing"))
ROLLOUT_HF = MeasuredCsv(
    "rollout_hf.csv",
    columns=("model", "method", "rank", "batch", "tokens_per_s", "completion_tokens"),
    key=("model", "method", "batch"),
    required=())  # transformers' own generate, for reference; no table reads it

MEASURED_CSVS: dict[str, MeasuredCsv] = {c.name: c for c in (ROLLOUT, E2E, MEMORY, ROLLOUT_HF)}
