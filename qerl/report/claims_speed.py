"""Claims 1 and 2, speed and memory: QeRL's rollout and end-to-end speedups over BF16 LoRA, and a 32B model's GRPO
steps on one 80 GB GPU, from the committed measurements (results/measured/<gpu>/, each model from its own folder:
qerl/report/context.py) through the Table 3 / 5-8 arithmetic (qerl/report/efficiency_tables.py); and, for the
record, this scale's own step phases. When the models' GPUs differ, each row names its model's ("7B (h100)") and a
line says which file each model's numbers come from; a speedup only ever divides two numbers of one model, so of one
GPU.
"""
from __future__ import annotations

from qerl.contract.methods import METHODS, get_method
from qerl.report.claims_verdicts import fmt, tracked_context
from qerl.report.context import Context, Needs, RunSpec, task_name, trained_methods
from qerl.report.speed import e2e_speedup, method_aliases, rollout_ratio
from qerl.report.inputs import summarize

__all__ = ["TIMED", "speed_claim", "memory_32b_claim", "cpu_timing"]


TIMED = ("lora", "qlora", "nvfp4_lora", "qerl")  # the GRPO runs whose step phases the claims print (cpu_timing)


def _short(method: str) -> str:
    """A method's short label (efficiency tables), or the name as measured when the registry does not know it."""
    return METHODS[method].short if method in METHODS else method


# --------------------------------------------------------------------------------------------- claim 1, 2: speed
def _num(x) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else None


def _cell(x) -> str:
    return f"{x:.2f}" if _num(x) is not None else str(x)


def speed_claim(cfg: dict, seen: list[Context]) -> tuple[list[str], str] | None:
    """Claim 1 from the committed rollout.csv / e2e.csv (the Table 5-8 arithmetic); None when neither exists."""
    ctx = tracked_context(cfg, Needs(measured=("rollout.csv", "e2e.csv")), seen)
    rollout, e2e = ctx.measured("rollout.csv"), ctx.measured("e2e.csv")
    if rollout is None and e2e is None:
        return None
    rows, rx, ex, qx = [], [], [], []
    models = list(dict.fromkeys(r["model"] for r in (rollout or []) + (e2e or [])))
    for model in models:
        batches = sorted({r["batch"] for r in (rollout or []) + (e2e or []) if r["model"] == model})
        for batch in batches:
            def tps(method):
                cands = [r for r in rollout or [] if r["model"] == model and r["batch"] == batch
                         and r["method"] in method_aliases(method)]
                return min(cands, key=lambda r: r["rank"])["tokens_per_s"] if cands else None
            q, ref = tps("qerl"), tps("lora")
            roll = rollout_ratio(q, ref)
            e_no, e_gc = (e2e_speedup(e2e, model, "qerl", batch, gc) for gc in (False, True))
            ql_no, ql_gc = (e2e_speedup(e2e, model, "qlora", batch, gc) for gc in (False, True))
            rx += [roll] if _num(roll) is not None else []
            ex += [v for v in (e_no, e_gc) if _num(v) is not None]
            qx += [v for v in (ql_no, ql_gc) if _num(v) is not None]
            rows.append(f"| {ctx.measured_model(model)} | {batch} | {_cell(roll)} | "
                        f"{_cell(e_no)} | {_cell(e_gc)} | {_cell(ql_no)} | {_cell(ql_gc)} |")

    def span(xs: list[float], lo: float, hi: float | None, what: str) -> str:
        if not xs:
            return f"{what}: not measured"
        inside = sum(1 for x in xs if x >= lo and (hi is None or x <= hi))
        band = f">= {lo:g}x" if hi is None else f"in {lo:g}-{hi:g}x"
        verdict = "holds" if inside == len(xs) else ("not reproduced" if inside == 0 else "partly")
        return f"{what} {min(xs):.2f}-{max(xs):.2f}x, {band} in {inside} of {len(xs)} cells: **{verdict}**"

    summary = "; ".join([span(rx, 1.5, None, "QeRL rollout"), span(ex, 1.2, 1.5, "QeRL E2E"),
                         span(qx, 0.7, 0.9, "QLoRA E2E")])
    where = "; ".join(s for s in ctx.prov.sources)
    gpus = ctx.measured_gpus_line()
    per_model = f" GPU per model (in the model column): {gpus}." if gpus else ""
    lines = [f"Measured ({where}); speedup = BF16 LoRA time / method time at the same batch, rollout at the lowest "
             "LoRA rank measured; E2E without and with gradient checkpointing (GC); \"OOM\" or \"s/step\" where "
             f"BF16 LoRA has no step to compare with.{per_model}", "",
             "| model | batch | QeRL rollout x | QeRL E2E x | QeRL E2E x (GC) | QLoRA E2E x | QLoRA E2E x (GC) |",
             "|---|---|---|---|---|---|---|", *rows, "", f"- {summary}.", ""]
    return lines, summary + "."


def memory_32b_claim(cfg: dict, seen: list[Context]) -> tuple[list[str], str] | None:
    """Claim 2 from the committed memory.csv and e2e.csv rows of the 32B model; None when there are none."""
    ctx = tracked_context(cfg, Needs(measured=("e2e.csv", "memory.csv")), seen)
    memory = ctx.measured("memory.csv", "32B") or []  # the rows' model is the paper's label (inputs.py)
    e2e = ctx.measured("e2e.csv", "32B") or []
    if not memory and not e2e:
        return None
    lines = [f"- {_short(r['method'])}: weights {r['model_size_gb']:.1f} GB, peak "
             f"{_cell(r['peak_gb'])} GB (memory.csv)" for r in memory]
    lines += [f"- {_short(r['method'])} GRPO step, batch {r['batch']}"
              f"{' with GC' if r['gc'] else ''}: {_cell(r['step_s'])}{'' if r['step_s'] == 'OOM' else ' s'}"
              for r in e2e]
    qerl_peak = [_num(r["peak_gb"]) for r in memory if r["method"] in method_aliases("qerl")]
    qerl_steps = [r for r in e2e if r["method"] in method_aliases("qerl") and _num(r["step_s"]) is not None]
    lora_peak = [_cell(r["peak_gb"]) for r in memory if r["method"] == "lora"]
    others = f"; BF16 LoRA's peak: {lora_peak[0]} GB" if lora_peak else ""
    # the paper's Table 3 has BF16 LoRA 32B out of memory, with GC and without: say where its step completed here
    # under 80 GB (memory.csv's peak is that of the step at its batch / GC, when the file names them)
    lora_mem = [r for r in memory if r["method"] == "lora" and _num(r["peak_gb"]) is not None
                and _num(r["peak_gb"]) <= 80]
    lora_steps = [r for r in e2e if r["method"] == "lora" and _num(r["step_s"]) is not None and lora_mem
                  and lora_mem[0].get("batch") in (None, r["batch"])
                  and lora_mem[0].get("gradient_checkpointing") in (None, r["gc"])]
    if lora_steps:
        r = min(lora_steps, key=lambda r: (r["batch"], r["gc"]))
        others += (f", and BF16 LoRA completes its step too (batch {r['batch']}{' with GC' if r['gc'] else ''}: "
                   f"{r['step_s']:.1f} s; the paper's Table 3: OOM)")
    if qerl_steps and qerl_peak and all(p is not None and p <= 80 for p in qerl_peak):
        verdict = (f"**holds**: QeRL 32B completes GRPO steps and its measured peak is {max(qerl_peak):.1f} GB "
                   f"(<= 80 GB){others}")
    elif qerl_steps or qerl_peak:
        verdict = "**not shown**: no QeRL 32B step with a measured peak <= 80 GB"
    else:
        verdict = "**not measured** for QeRL"
    where = "; ".join(ctx.prov.sources)
    return [f"Measured ({where}):", "", *lines, "", f"- {verdict}.", ""], verdict + "."


def cpu_timing(cfg: dict, seen: list[Context]) -> list[str]:
    """Per-step rollout and update seconds of the GRPO runs (this scale's own hardware)."""
    ctx = tracked_context(cfg, Needs(), seen)
    lines = []
    for method in TIMED:
        if method not in trained_methods(cfg, "grpo") or task_name(cfg, "grpo") is None:
            continue
        per_seed = ctx.metrics(RunSpec("grpo", method))
        roll = summarize([sum(m["time_rollout"]) / len(m["time_rollout"]) for m in per_seed])
        upd = summarize([sum(m["time_update"]) / len(m["time_update"]) for m in per_seed])
        lines.append(f"| {get_method(method).prose} | {fmt(roll)} | {fmt(upd)} |")
    if not lines:
        return []
    return ["| method | rollout s/step | update s/step |", "|---|---|---|", *lines]
