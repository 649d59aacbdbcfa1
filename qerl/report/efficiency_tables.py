"""The efficiency tables: Tables 3, 5-8 and 9 (speed and memory), from the committed GPU measurements.

How ours map onto the paper's rows (rows are keyed by model and method, and batch in Tables 5-8): from
results/measured/<gpu>/*.csv (qerl/report/inputs.py states the files), each model from its own GPU folder
(qerl/report/context.py says which): a table of one model (Tables 5-8) names that GPU in its column labels; Tables 3
and 9, when their models come from more than one folder, add an "ours: GPU" column and a caption line saying which
GPU (and file) each model's numbers come from. When a file is absent, every one of our cells reads "not measured"
and the caption says which file is missing. Speedups are BF16 LoRA's step time (or rollout
tokens/s) over the method's, same model and batch, as in the paper; QeRL rows read the method "qerl" (or
"nvfp4_lora"). Table 9 adds rows for our QeRL rank-ablation runs when their metrics carry rollout_tokens (tokens/s =
rollout_tokens / time_rollout, mean over steps, then over seeds).

The speedup arithmetic (method_aliases, e2e_speedup, speedup_cell) is qerl/report/speed.py, shared with the figures,
the batch sweep and the claims. Number formats and the files written: qerl/report/tables.py.
Run: `qerl render --config config/config.yaml --artifact table3`.
"""
from __future__ import annotations

from typing import Any

from qerl.contract.methods import SPEED_METHODS, get_method
from qerl.report import paper
from qerl.report.context import Context
from qerl.report.inputs import summarize
from qerl.report.speed import NOT_MEASURED, find_row, method_aliases, rollout_ratio, speedup_cell
from qerl.report.tables import Column, Table, merge_rows, over_seeds

__all__ = ["render_table3", "render_table5_8", "render_table9"]

def _step_cell(e2e: list[dict] | None, model: str, method: str, batch: int, gc: bool) -> Any:
    row = find_row(e2e, method, model=model, batch=batch, gc=gc) if e2e is not None else None
    return NOT_MEASURED if row is None else row["step_s"]


def _peak_column(memory: list[dict] | None) -> str:
    """Name of the peak-memory column, saying which step it is the peak of (memory.csv's batch and checkpointing)."""
    steps = {(r.get("batch"), r.get("gradient_checkpointing")) for r in memory or []}
    if len(steps) != 1 or None in next(iter(steps)):
        return "peak (GB)"
    batch, gc = next(iter(steps))
    return f"peak (GB), bs{batch} {'with' if gc else 'without'} GC"


def _not_measured_note(ctx: Context, names: list[str], data: dict[str, Any], model: str | None = None) -> None:
    absent = [n for n in names if data[n] is None]
    if absent:
        where = ", ".join(ctx.measured_where(n, model) for n in absent)
        ctx.notes.append(f"Cells marked '{NOT_MEASURED}': {where} absent (the profiling stage writes these on a GPU; "
                         "no number is made up).")


def _fill_not_measured(rows: list[dict], columns: list[Column]) -> None:
    for row in rows:
        for c in columns:
            if c.kind == "ours" and row.get(c.name) is None:
                row[c.name] = NOT_MEASURED


_GPU = "ours: GPU"  # the measured folder of a row's model, in tables spanning models whose GPUs differ


def _gpu_column(ctx: Context) -> list[Column]:
    """[the "ours: GPU" column] when the models' measured folders differ, else [] (the column labels name the GPU)."""
    return [Column(_GPU, "ours")] if ctx.measured_mixed() else []


def _gpus_sentence(ctx: Context, name: str | None = None) -> str:
    """" GPU per model (column 'ours: GPU'): 7B: h100 (...); 3B, 14B: h200 (...)." or "" for one folder."""
    line = ctx.measured_gpus_line(name)
    return f" GPU per model (column '{_GPU}'): {line}." if line else ""


def render_table3(ctx: Context, artifact) -> Table:
    """Table 3: model size and end-to-end GRPO step speedup over BF16 LoRA at batch 2, 4, 8 (no grad. ckpt)."""
    data = {n: ctx.measured(n) for n in ("e2e.csv", "memory.csv")}
    _not_measured_note(ctx, list(data), data)
    o, mixed = ctx.measured_label(), ctx.measured_mixed()
    peak = f"{o}: {_peak_column(data['memory.csv'])}"
    columns = [Column("model", "key"), Column("method", "key"), Column("W#", "key"),
               Column("paper: model size (GB)", "paper"),
               *[Column(f"paper: x bs{b}", "paper") for b in (2, 4, 8)], *_gpu_column(ctx),
               Column(f"{o}: model size (GB)", "ours", 2),
               *[Column(f"{o}: step s bs{b}", "ours", 1) for b in (2, 4, 8)],
               *[Column(f"{o}: x bs{b}", "ours", 2) for b in (2, 4, 8)], Column(peak, "ours", 2)]
    rows = [{"model": r["model"], "method": get_method(r["method"]).short, "W#": r["wbits"],
             "paper: model size (GB)": r["size_gb"],
             **{f"paper: x bs{b}": ("-" if r[f"x_bs{b}"] is None else r[f"x_bs{b}"]) for b in (2, 4, 8)}}
            for r in paper.TABLE3]
    models = list(dict.fromkeys(r["model"] for rows_ in data.values() for r in rows_ or []))
    ours = []
    for model in models:
        for method in SPEED_METHODS:
            mem = find_row(data["memory.csv"], method, model=model)
            row = {"model": model, "method": get_method(method).short, "W#": get_method(method).wbits,
                   **({_GPU: ctx.measured_gpu(model)} if mixed else {}),
                   f"{o}: model size (GB)": mem["model_size_gb"] if mem else NOT_MEASURED,
                   peak: mem["peak_gb"] if mem else NOT_MEASURED}
            row.update({f"{o}: step s bs{b}": _step_cell(data["e2e.csv"], model, method, b, False) for b in (2, 4, 8)})
            row.update({f"{o}: x bs{b}": speedup_cell(data["e2e.csv"], model, method, b, False) for b in (2, 4, 8)})
            ours.append(row)
    rows = merge_rows(rows, ours, ("model", "method"))
    _fill_not_measured(rows, columns)
    caption = (f"{artifact.caption} Ours: one measurement per cell from the committed profiling files. step s: "
               "seconds per GRPO step without gradient checkpointing (GC), as the paper's speedups are, or OOM when "
               "it ran out of GPU memory; x: BF16 LoRA step time / the method's, '-' for BF16 LoRA itself, OOM where "
               "the method ran out of memory, n/a where only BF16 LoRA did. The peak column is the peak memory of "
               "the step memory.csv names (with GC), so a model can show a peak next to OOM steps without GC."
               f"{_gpus_sentence(ctx)}")
    return Table(artifact.id, artifact.title, caption, ctx.prov.fields(), columns, rows, list(ctx.notes))


def render_table5_8(ctx: Context, artifact) -> Table:
    """Tables 5-8 (3B, 7B, 14B, 32B): rollout tokens/s and speedups, E2E speedup without and with grad. ckpt."""
    model = paper.TABLE5_8_MODEL[artifact.id]
    data = {n: ctx.measured(n, model) for n in ("rollout.csv", "e2e.csv", "memory.csv")}  # one folder: the model's
    _not_measured_note(ctx, list(data), data, model)
    o = ctx.measured_label(model)
    names = ["size (GB)", "rollout tok/s", "rollout x", "E2E x w/o GC", "E2E x w/ GC"]
    columns = [Column("model", "key"), Column("method", "key"), Column("W#", "key"), Column("BS", "key"),
               *[Column(f"paper: {n}", "paper") for n in names],
               *[Column(f"{o}: {n}", "ours", 2) for n in names]]
    paper_rows = [r for r in paper.TABLE5_8 if r["model"] == model]
    rows = []
    for r in paper_rows:
        vals = [r["size_gb"], r["rollout_tps"], r["rollout_x"], r["e2e_x"], r["e2e_x_gc"]]
        rows.append({"model": model, "method": get_method(r["method"]).short, "W#": r["wbits"], "BS": r["batch"],
                     **{f"paper: {n}": ("-" if v is None else v) for n, v in zip(names, vals)}})
    rollout = data["rollout.csv"] or []
    batches = sorted({r["batch"] for r in rollout} | {r["batch"] for r in data["e2e.csv"] or []})
    ranks_used: dict[int, set[int]] = {}  # rank -> batches whose rollout cells are at that rank
    ours = []
    for batch in batches:
        for method in ("lora", "qerl"):
            candidates = [r for r in rollout if r["method"] in method_aliases(method) and r["batch"] == batch]
            ref_cands = [r for r in rollout if r["method"] == "lora" and r["batch"] == batch]
            tps = min(candidates, key=lambda r: r["rank"]) if candidates else None
            ref = min(ref_cands, key=lambda r: r["rank"]) if ref_cands else None
            if tps:
                ranks_used.setdefault(tps["rank"], set()).add(batch)
            mem = find_row(data["memory.csv"], method, model=model)
            rollout_x = "-" if method == "lora" else rollout_ratio(tps and tps["tokens_per_s"],
                                                                  ref and ref["tokens_per_s"])
            vals = [mem["model_size_gb"] if mem else NOT_MEASURED, tps["tokens_per_s"] if tps else NOT_MEASURED,
                    rollout_x if tps else NOT_MEASURED,
                    speedup_cell(data["e2e.csv"], model, method, batch, False),
                    speedup_cell(data["e2e.csv"], model, method, batch, True)]
            ours.append({"model": model, "method": get_method(method).short, "BS": batch,
                         "W#": get_method(method).wbits, **{f"{o}: {n}": v for n, v in zip(names, vals)}})
    rows = merge_rows(rows, ours, ("model", "method", "BS"))
    _fill_not_measured(rows, columns)
    if data["rollout.csv"] is not None and not rollout:
        ctx.notes.append(f"{ctx.measured_where('rollout.csv', model)} has no rows for {model}.")
    if len(ranks_used) == 1:
        ranks = f"; rollout at LoRA rank {next(iter(ranks_used))}"
    elif ranks_used:
        ranks = "; rollout at the smallest LoRA rank measured at each batch: " + ", ".join(
            f"rank {r} at batch {', '.join(map(str, sorted(b)))}" for r, b in sorted(ranks_used.items()))
    else:
        ranks = ""
    caption = (f"{artifact.caption} Ours: one measurement per cell{ranks}. The paper's numbers equal its rank-16 "
               f"Table 9 values. E2E x: BF16 LoRA step time / the method's, '-' for BF16 LoRA itself, OOM when the "
               f"method ran out of GPU memory, n/a where only BF16 LoRA did. vLLM memory utilisation in the paper: "
               f"{paper.VLLM_MEMORY_UTILIZATION[model]}.")
    return Table(artifact.id, artifact.title, caption, ctx.prov.fields(), columns, rows, list(ctx.notes))


def render_table9(ctx: Context, artifact) -> Table:
    """Table 9: rollout tokens/s by LoRA rank at batch 1 (ours: measured, and our QeRL rank-ablation runs)."""
    measured = ctx.measured("rollout.csv")
    _not_measured_note(ctx, ["rollout.csv"], {"rollout.csv": measured})
    mixed = ctx.measured_mixed()
    wlabel = {"lora": "BF16", "qerl": "NVFP4", "qlora": "NF4 (QLoRA)"}
    rank_specs = [s for s in ctx.needs.runs if s.variant.startswith("rank")]
    ranks = sorted(set(paper.TABLE9_RANKS) | {r["rank"] for r in measured or []}
                   | {int(s.variant[4:]) for s in rank_specs})
    columns = [Column("model", "key"), Column("W#", "key"),
               *[Column(f"paper: r{r}", "paper") for r in paper.TABLE9_RANKS], *_gpu_column(ctx),
               *[Column(f"ours: r{r}", "ours") for r in ranks]]
    rows: list[dict] = []
    for r in paper.TABLE9:
        key = {"model": r["model"], "method": r["method"]}
        row = next((x for x in rows if all(x[k] == v for k, v in key.items())), None)
        if row is None:
            row = {**key, "W#": wlabel[r["method"]]}
            rows.append(row)
        row[f"paper: r{r['rank']}"] = r["tokens_per_s"]
    ours = []
    batch_note = set()
    for model in dict.fromkeys(r["model"] for r in measured or []):
        for method in ("lora", "qerl", "qlora"):
            cand = [r for r in measured if r["model"] == model and r["method"] in method_aliases(method)]
            if not cand:
                continue
            batch = 1 if any(r["batch"] == 1 for r in cand) else min(r["batch"] for r in cand)
            batch_note.add(batch)
            row = {"model": model, "method": method, "W#": wlabel[method],
                   **({_GPU: ctx.measured_gpu(model)} if mixed else {})}
            row.update({f"ours: r{r['rank']}": r["tokens_per_s"] for r in cand if r["batch"] == batch})
            ours.append(row)
    rows = merge_rows(rows, ours, ("model", "method"))
    for row in rows:
        for name in [*([_GPU] if mixed else []), *(f"ours: r{r}" for r in ranks)]:
            if row.get(name) is None:
                row[name] = NOT_MEASURED
    if rank_specs:
        row = {"model": ctx.model, "method": "qerl-runs", "W#": f"NVFP4, QeRL training rollouts ({ctx.scale})",
               **({_GPU: "n/a (training runs)"} if mixed else {})}
        for spec in rank_specs:
            per_seed = ctx.metrics(spec)
            tps = []
            for m in per_seed:
                vals = [t / s for t, s in zip(m["rollout_tokens"], m["time_rollout"]) if s > 0 and t == t]
                tps.append(sum(vals) / len(vals) if vals else float("nan"))
            row[f"ours: r{spec.variant[4:]}"] = summarize(tps)
        rows.append(row)
    where = f"batch {', '.join(map(str, sorted(batch_note)))}" if batch_note else "batch 1"
    runs_row = (f"the last row is our QeRL rank-ablation training runs on this scale's hardware, per-step "
                f"rollout_tokens / time_rollout averaged over steps, {over_seeds(ctx.read_seeds())}; "
                if rank_specs else "")
    caption = (f"{artifact.caption} Ours: measured rows at {where} ({ctx.measured_where('rollout.csv')}); "
               f"{runs_row}{paper.FIG11_NOTE}{_gpus_sentence(ctx, 'rollout.csv')}")
    return Table(artifact.id, artifact.title, caption, ctx.prov.fields(), columns, rows, list(ctx.notes))
