"""The speed arithmetic over the measured rows (qerl.contract.measured), shared by the efficiency tables, the figures,
the batch sweep and the speed claims: which rows stand for a method, and the speedup over BF16 LoRA as the paper
prints it. A speedup divides two rows of one model, and a model's rows come from one GPU folder
(qerl/report/context.py), so never numbers of two GPUs.
"""
from __future__ import annotations

from typing import Any

__all__ = ["NOT_MEASURED", "method_aliases", "find_row", "e2e_speedup", "speedup_cell", "rollout_ratio"]

NOT_MEASURED = "not measured"


_QERL = ("qerl", "nvfp4_lora")


def method_aliases(method: str) -> tuple[str, ...]:
    """The measured rows' method names that stand for `method`: QeRL's speed is its NVFP4 LoRA's (AQN costs no
    time), so "qerl" also reads "nvfp4_lora" rows."""
    return _QERL if method == "qerl" else (method,)


def find_row(rows: list[dict] | None, method: str, **match) -> dict | None:
    """The first row of `method` (or an alias) whose columns equal `match`; None when there is none."""
    for alias in method_aliases(method):
        for r in rows or []:
            if r["method"] == alias and all(r[k] == v for k, v in match.items()):
                return r
    return None


def e2e_speedup(e2e: list[dict] | None, model: str, method: str, batch: int, gc: bool) -> Any:
    """BF16 LoRA step time over the method's, as the paper prints it ("-" for the reference, "OOM", "<t> s/step")."""
    if e2e is None:
        return NOT_MEASURED
    row = find_row(e2e, method, model=model, batch=batch, gc=gc)
    if row is None:
        return NOT_MEASURED
    if row["step_s"] == "OOM":
        return "OOM"
    if method == "lora":
        return "-"
    ref = find_row(e2e, "lora", model=model, batch=batch, gc=gc)
    if ref is None:
        return f"{row['step_s']:.1f} s/step (no BF16 LoRA row)"
    assert ref.get("gpu") == row.get("gpu"), f"{model}: a speedup across GPUs ({ref.get('gpu')}, {row.get('gpu')})"
    if ref["step_s"] == "OOM":
        return f"{row['step_s']:.1f} s/step"
    return ref["step_s"] / row["step_s"]


def speedup_cell(e2e: list[dict] | None, model: str, method: str, batch: int, gc: bool) -> Any:
    """A table cell of E2E speedup over BF16 LoRA: the ratio, "-" for BF16 LoRA itself, "OOM" when the method ran
    out of memory, "n/a (BF16 LoRA OOM)" when only the reference did (the step time is in its own column or the
    caption), or "not measured"; never a time in a column of ratios."""
    value = e2e_speedup(e2e, model, method, batch, gc)
    if isinstance(value, str) and value.endswith("s/step"):
        ref = find_row(e2e, "lora", model=model, batch=batch, gc=gc)
        return "n/a (BF16 LoRA OOM)" if ref is not None else "n/a (no BF16 LoRA row)"
    return value


def rollout_ratio(tps: Any, ref: Any) -> Any:
    """A method's rollout tokens/s over BF16 LoRA's (each a number, "OOM" where the rollout ran out of memory, or None
    when not measured): the ratio, "OOM" when the method ran out of memory, "n/a (BF16 LoRA OOM)" when only the
    reference did, or "not measured"."""
    if tps == "OOM":
        return "OOM"
    if tps is None or ref is None:
        return NOT_MEASURED
    if ref == "OOM":
        return "n/a (BF16 LoRA OOM)"
    return tps / ref if ref else NOT_MEASURED
