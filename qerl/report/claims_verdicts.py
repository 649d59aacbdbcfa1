"""How a claim compares two means over seeds, and how the comparison reads in claims.md.

A comparison of two means a - b reads "holds" when a - b > 2 SE (SE = sqrt(std_a^2/n_a + std_b^2/n_b), the seeds'
spread), "contradicted" when a - b < -2 SE, and "within noise" otherwise; with one seed there is no spread and the
sign alone is reported. Every claim reads its files through a tracked_context, so that the provenance of all of them
(commits, hardware of the files read) ends up in the document's header (qerl/report/claims.py).
"""
from __future__ import annotations

import math

from qerl.report import tables
from qerl.report.context import Context, Needs
from qerl.report.inputs import Stat

__all__ = ["compare", "tracked_context", "fmt", "diff_text", "tally_text"]


def compare(a: Stat, b: Stat) -> tuple[float, float | None, str]:
    """(a - b, its standard error or None, verdict on "a > b") as the module docstring defines them."""
    diff = a.mean - b.mean
    if a.std is None or b.std is None or a.n < 2 or b.n < 2:
        return diff, None, ("holds (one seed, no spread)" if diff > 0 else "does not hold (one seed, no spread)")
    se = math.sqrt(a.std ** 2 / a.n + b.std ** 2 / b.n)
    if diff > 2 * se:
        return diff, se, "holds"
    if diff < -2 * se:
        return diff, se, "contradicted"
    return diff, se, "within noise"


def tracked_context(cfg: dict, needs: Needs, seen: list[Context]) -> Context:
    """A Context whose provenance (commits, hardware of the files read) ends up in the document's header; the
    document's contexts share their parsed files (Context.reads), so a file several claims use is read once."""
    ctx = Context(cfg, needs, reads=seen[0].reads if seen else {})
    seen.append(ctx)
    return ctx


def fmt(x: Stat | float | None, digits: int = 3) -> str:
    if isinstance(x, Stat):
        return tables.format_value(x, digits)
    return "n/a" if x is None or not math.isfinite(x) else f"{x:.{digits}f}"


def diff_text(a: Stat, b: Stat, digits: int, tally: list[str] | None = None) -> str:
    """"+1.2 ± 0.3 SE: **holds**"; the verdict's first word is appended to `tally` when given."""
    diff, se, verdict = compare(a, b)
    if tally is not None:
        tally.append(verdict.split(" (")[0])
    spread = f" ± {se:.{digits}f} SE" if se is not None else ""
    return f"{diff:+.{digits}f}{spread}: **{verdict}**"


def tally_text(tally: list[str]) -> str:
    """"2 hold, 1 within noise" from a list of verdicts."""
    names = {"holds": "hold", "does not hold": "do not hold"}
    order = ("holds", "within noise", "contradicted", "does not hold")
    return ", ".join(f"{tally.count(v)} {names.get(v, v)}" for v in order if v in tally) or "nothing to compare"
