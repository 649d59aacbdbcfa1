"""Table renderers (Tables 1-9) and the Markdown / LaTeX / CSV / HTML writers.

Why: every paper table is printed with the paper's numbers in "paper: ..." columns and ours in "ours (<scale>): ..."
columns, never in the same column, with a header line naming scale, model, seeds, commit and hardware.

How ours map onto the paper's rows (rows are keyed by model and method):
- Tables 1 and 2: our model's rows carry the paper's W# / training labels. When our model is one of the paper's
  sizes ("Qwen2.5-7B-Instruct" -> 7B) our values sit in the paper's rows of that size; otherwise (tiny, small) they
  form their own block of rows, model = the config's model name, after the paper's rows, with the paper's columns
  empty. Our columns: pass@1 (mean +/- std over seeds) on each benchmark of the task's role
  (qerl.report.context.role_benchmarks), their average when there are several, and the per-level pass@1 when
  there is a single benchmark graded by level (the tiny scale: levels stand in for the paper's easier and harder
  benchmarks). Methods the config does not run read "not run".
- Tables 3, 5-8, 9 (speed and memory): from results/measured/<gpu>/*.csv (qerl/report/inputs.py states the files).
  When a file is absent, every one of our cells reads "not measured" and the caption says which file is missing.
  Speedups are BF16 LoRA's step time (or rollout tokens/s) over the method's, same model and batch, as in the paper;
  QeRL rows read the method "qerl" (or "nvfp4_lora"). Table 9 adds rows for our QeRL rank-ablation runs when their
  metrics carry rollout_tokens (tokens/s = rollout_tokens / time_rollout, mean over steps, then over seeds).
- Table 4: the config actually used (the validated train section).

Number formats: paper values as printed (one decimal); ours mean +/- sample std (ddof 1) over seeds, one decimal for
percentages, two for speedups. CSV keeps numbers machine-readable: each of our columns has "<col> std" and "<col> n"
beside it, and the header lines start with "#" (read with `pandas.read_csv(path, comment="#")`).

Run: `qerl render --config config/config.yaml --artifact table1`.
"""
from __future__ import annotations

import csv
import html
import io
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from qerl.io import write_text
from qerl.report import paper
from qerl.report.context import Context, EvalSpec, RunSpec, role_benchmarks, untrained_benchmarks
from qerl.contract.methods import get_method
from qerl.contract.records import BenchmarkRecord
from qerl.report.inputs import Stat, paper_model_label, summarize

__all__ = [
    "Column",
    "Table",
    "NOT_MEASURED",
    "NOT_RUN",
    "format_value",
    "over_seeds",
    "to_markdown",
    "to_latex",
    "to_csv",
    "to_html",
    "html_page",
    "write_table",
    "render_table1",
    "render_table2",
    "render_table3",
    "render_table4",
    "render_table5_8",
    "render_table9",
    "find_row",
    "e2e_speedup",
    "speedup_cell",
    "method_aliases",
    "config_value",
]

NOT_MEASURED = "not measured"
NOT_RUN = "not run"
NOT_CONFIGURED = "n/a (not configured)"


@dataclass
class Column:
    """A table column: `kind` is "key" (row label), "paper" or "ours"; `digits` for numbers."""

    name: str
    kind: str
    digits: int = 1


@dataclass
class Table:
    """A rendered table, before it is written. Rows map column names to values (absent = empty cell)."""

    id: str
    title: str
    caption: str
    header: dict[str, str]
    columns: list[Column]
    rows: list[dict[str, Any]]
    notes: list[str] = field(default_factory=list)

    def column_names(self, kind: str | None = None) -> list[str]:
        return [c.name for c in self.columns if kind is None or c.kind == kind]


# --------------------------------------------------------------------------------------------------- formatting
def format_value(value: Any, digits: int = 1, latex: bool = False) -> str:
    """Text of one cell: None -> "", Stat -> "mean ± std" (or the mean alone for one seed), float -> fixed digits."""
    pm = r" $\pm$ " if latex else " ± "
    if value is None:
        return ""
    if isinstance(value, Stat):
        if value.n == 0 or not math.isfinite(value.mean):
            return "n/a"
        text = f"{value.mean:.{digits}f}"
        return text + (f"{pm}{value.std:.{digits}f}" if value.std is not None else "")
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return f"{value:.{digits}f}" if math.isfinite(value) else "n/a"
    text = str(value)
    return _latex_escape(text) if latex else text


_LATEX = {"&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_", "{": r"\{", "}": r"\}", "~": r"\~{}",
          "^": r"\^{}", "\\": r"\textbackslash{}", "±": r"$\pm$"}


def _latex_escape(text: str) -> str:
    return "".join(_LATEX.get(ch, ch) for ch in text)


def _md_cell(text: str) -> str:
    return text.replace("|", r"\|").replace("\n", " ")


def to_markdown(table: Table) -> str:
    """The table as Markdown: title, header line, the grid, caption and notes."""
    out = [f"# {table.title}", "", "_" + " | ".join(f"{k}: {v}" for k, v in table.header.items()) + "_", ""]
    out.append("| " + " | ".join(_md_cell(c.name) for c in table.columns) + " |")
    out.append("|" + "|".join("---" for _ in table.columns) + "|")
    for row in table.rows:
        cells = [_md_cell(format_value(row.get(c.name), c.digits)) for c in table.columns]
        out.append("| " + " | ".join(cells) + " |")
    out += ["", table.caption]
    if table.notes:
        out += [""] + [f"- {n}" for n in table.notes]
    return "\n".join(out) + "\n"


def to_latex(table: Table) -> str:
    """The table as a LaTeX `table` environment (booktabs), header and notes in the caption."""
    spec = "".join("l" if c.kind == "key" else "r" for c in table.columns)
    header = "; ".join(f"{k}: {v}" for k, v in table.header.items())
    lines = [f"% {table.title}", f"% {header}", r"\begin{table}[t]", r"\centering", r"\small",
             rf"\begin{{tabular}}{{{spec}}}", r"\toprule",
             " & ".join(_latex_escape(c.name) for c in table.columns) + r" \\", r"\midrule"]
    for row in table.rows:
        lines.append(" & ".join(format_value(row.get(c.name), c.digits, latex=True) for c in table.columns) + r" \\")
    caption = " ".join([table.title + ".", table.caption, *table.notes, f"({header})"])
    lines += [r"\bottomrule", r"\end{tabular}", rf"\caption{{{_latex_escape(caption)}}}",
              rf"\label{{tab:qerl-{table.id}}}", r"\end{table}"]
    return "\n".join(lines) + "\n"


def to_csv(table: Table) -> str:
    """The table as CSV: "#" header lines, then one column per key/paper column and mean, std, n per ours column."""
    buf = io.StringIO()
    for key, value in [("title", table.title), *table.header.items()]:
        buf.write(f"# {key}: {value}\n")
    names: list[str] = []
    for c in table.columns:
        names += [c.name, f"{c.name} std", f"{c.name} n"] if c.kind == "ours" else [c.name]
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(names)
    for row in table.rows:
        cells: list[Any] = []
        for c in table.columns:
            value = row.get(c.name)
            if isinstance(value, Stat):
                main = "" if value.n == 0 else repr(round(value.mean, 6))
                cells += [main, "" if value.std is None else repr(round(value.std, 6)), value.n]
            else:
                main = "" if value is None else (repr(round(value, 6)) if isinstance(value, float) else value)
                cells += [main, "", ""] if c.kind == "ours" else [main]
        writer.writerow(cells)
    return buf.getvalue()


# The look of every HTML page the report embeds (tables, claims): our columns tinted blue, the paper's grey.
_CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", Helvetica, Arial, sans-serif; color: #222; margin: 1.2em; }
h1 { font-size: 1.2em; } h2 { font-size: 1.05em; margin-top: 1.4em; }
p.provenance { color: #555; font-size: 0.85em; }
table { border-collapse: collapse; font-size: 0.85em; margin: 0.8em 0; }
th, td { border: 1px solid #b8b8b8; padding: 0.25em 0.55em; text-align: right; white-space: nowrap; }
th { background: #e4e4e4; } th.key, td.key, th:first-child, td:first-child { text-align: left; }
th.paper { background: #d6d6d6; } td.paper { background: #f2f2f2; }
th.ours { background: #c9dcf3; } td.ours { background: #eaf2fc; }
p.caption, ul.notes { max-width: 70em; font-size: 0.9em; }
"""


def html_page(title: str, body: str) -> str:
    """A self-contained HTML page (inline style, no script, nothing fetched): what the Snakemake report shows."""
    return (f"<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
            f"<title>{html.escape(title)}</title>\n<style>{_CSS}</style>\n</head>\n<body>\n{body}\n</body>\n</html>\n")


def to_html(table: Table) -> str:
    """The table as an HTML page: title, header line, the grid (paper and ours columns tinted), caption, notes."""
    esc = html.escape
    head = "".join(f'<th class="{c.kind}">{esc(c.name)}</th>' for c in table.columns)
    rows = "\n".join("<tr>" + "".join(f'<td class="{c.kind}">{esc(format_value(row.get(c.name), c.digits))}</td>'
                                      for c in table.columns) + "</tr>" for row in table.rows)
    provenance = " | ".join(f"{esc(k)}: {esc(v)}" for k, v in table.header.items())
    notes = "".join(f"<li>{esc(n)}</li>" for n in table.notes)
    body = (f"<h1>{esc(table.title)}</h1>\n<p class=\"provenance\">{provenance}</p>\n"
            f"<table>\n<thead><tr>{head}</tr></thead>\n<tbody>\n{rows}\n</tbody>\n</table>\n"
            f"<p class=\"caption\">{esc(table.caption)}</p>" + (f"\n<ul class=\"notes\">{notes}</ul>" if notes else ""))
    return html_page(table.title, body)


def write_table(table: Table, out_dir: str | Path) -> list[Path]:
    """Write <out_dir>/<id>.md, .tex, .csv and .html atomically; returns the four paths."""
    out_dir = Path(out_dir)
    return [write_text(out_dir / f"{table.id}.md", to_markdown(table)),
            write_text(out_dir / f"{table.id}.tex", to_latex(table)),
            write_text(out_dir / f"{table.id}.csv", to_csv(table)),
            write_text(out_dir / f"{table.id}.html", to_html(table))]


# --------------------------------------------------------------------------------------------------- helpers
def over_seeds(seeds: list[int]) -> str:
    """How our cells summarise seeds: "mean ± sample std over seeds 0, 1, 2", or "one seed (0): single values"."""
    if len(seeds) == 1:
        return f"one seed ({seeds[0]}): single values, no spread"
    return f"mean ± sample std over seeds {', '.join(map(str, seeds))}"


def _merge(rows: list[dict], ours: list[dict], keys: tuple[str, ...]) -> list[dict]:
    """Put each of our rows into the paper row with the same keys, or append it as a row of its own."""
    index = {tuple(r.get(k) for k in keys): r for r in rows}
    for row in ours:
        target = index.get(tuple(row.get(k) for k in keys))
        if target is None:
            rows.append(row)
        else:
            target.update({k: v for k, v in row.items() if k not in target or k.startswith("ours")})
    return rows


def _load_eval(ctx: Context, role: str, method: str, benches: list[str]) -> list[dict[str, BenchmarkRecord]] | None:
    """Per-seed results of `method` on the role's benchmarks; None when the config does not run it."""
    if EvalSpec(role, method) in ctx.needs.evals:
        return ctx.untrained_evals(method, untrained_benchmarks(ctx.cfg, role))
    spec = RunSpec(role, method, "default", "eval.json")
    if spec in ctx.needs.runs:
        return ctx.run_evals(spec, benches)
    return None


def _pass1(per_seed: dict[str, BenchmarkRecord], bench: str) -> float:
    result = per_seed.get(bench)
    return result.pass_at_1 if result is not None else float("nan")


def _eval_cells(ctx: Context, role: str, methods: list[str]) -> tuple[list[Column], dict[str, dict | str]]:
    """Our columns for an accuracy table and, per method, {column: Stat} (or NOT_RUN).

    A benchmark a method was not evaluated on (e.g. an untrained format outside evaluate.benchmarks) reads "n/a".
    """
    benches = role_benchmarks(ctx.cfg, role)
    loaded = {m: _load_eval(ctx, role, m, benches) for m in methods}
    levels: list[str] = []
    if len(benches) == 1:
        seen = {lv for per_seed in loaded.values() if per_seed for s in per_seed if benches[0] in s
                for lv in s[benches[0]].per_level}
        levels = sorted(seen, key=lambda s: (len(s), s))
    prefix = ctx.ours()
    getters: list[tuple[str, Any]] = [(f"{prefix}: {b}", lambda s, b=b: _pass1(s, b)) for b in benches]
    if len(benches) > 1:
        getters.append((f"{prefix}: avg", lambda s: sum(_pass1(s, b) for b in benches) / len(benches)))
    # strict: the exact <think>/<answer> shape with a correct answer inside (the columns above grade flexibly)
    getters += [(f"{prefix}: {b} strict", lambda s, b=b: s[b].pass_at_1_strict if b in s else float("nan"))
                for b in benches]
    getters += [(f"{prefix}: {benches[0]} L{lv}",
                 lambda s, lv=lv: s[benches[0]].per_level.get(lv, float("nan")) if benches[0] in s else float("nan"))
                for lv in levels]
    cells: dict[str, dict | str] = {}
    for m, per_seed in loaded.items():
        if per_seed is None:
            cells[m] = NOT_RUN
        else:
            cells[m] = {name: summarize([get(s) for s in per_seed]) for name, get in getters}
    return [Column(name, "ours") for name, _ in getters], cells


def _accuracy_table(ctx: Context, artifact, role: str, paper_rows: list[dict], paper_models: tuple[str, ...],
                    paper_cols: list[tuple[str, str]]) -> Table:
    methods = list(dict.fromkeys(r["method"] for r in paper_rows))
    our_cols, cells = _eval_cells(ctx, role, methods)
    keys = [Column("model", "key"), Column("W#", "key"), Column("training", "key")]
    columns = keys + [Column(f"paper: {label}", "paper") for _, label in paper_cols] + our_cols
    rows = [{"model": r["model"], "method": r["method"], "W#": r["wbits"], "training": r["training"],
             **{f"paper: {label}": r[key] for key, label in paper_cols}} for r in paper_rows]
    label = paper_model_label(ctx.model)
    first = [r for r in paper_rows if r["model"] == paper_models[0]]
    ours = []
    for r in first:
        row = {"model": label, "method": r["method"], "W#": r["wbits"], "training": r["training"]}
        value = cells[r["method"]]
        row.update({c.name: value for c in our_cols} if isinstance(value, str) else value)
        ours.append(row)
    rows = _merge(rows, ours, ("model", "method"))
    place = (f"in the paper's {label} rows" if label in paper_models
             else f"in their own rows (model {ctx.model!r}), never in the paper's columns")
    caption = (f"{artifact.caption} Ours: pass@1 in %, {over_seeds(ctx.read_seeds())}, {place}. "
               "Rows without training are the untrained model in that format.")
    return Table(artifact.id, artifact.title, caption, ctx.prov.fields(), columns, rows, list(ctx.notes))


# --------------------------------------------------------------------------------------------------- Tables 1, 2
def render_table1(ctx: Context, artifact) -> Table:
    """Table 1: GSM8K pass@1 after GRPO, per format and training method (ours: the grpo task's benchmarks)."""
    return _accuracy_table(ctx, artifact, "grpo", paper.TABLE1, paper.TABLE1_MODELS, [("gsm8k", "GSM8K")])


def render_table2(ctx: Context, artifact) -> Table:
    """Table 2: BigMath/DAPO pass@1 on MATH500, AIME24, AIME25, AMC23 and average (ours: the dapo task's)."""
    cols = [("math500", "MATH500"), ("aime24", "AIME24"), ("aime25", "AIME25"), ("amc23", "AMC23"), ("avg", "avg")]
    return _accuracy_table(ctx, artifact, "dapo", paper.TABLE2, paper.TABLE2_MODELS, cols)


# --------------------------------------------------------------------------------------------------- measured
_QERL = ("qerl", "nvfp4_lora")


def method_aliases(method: str) -> tuple[str, ...]:
    return _QERL if method == "qerl" else (method,)


def find_row(rows: list[dict] | None, method: str, **match) -> dict | None:
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


def _not_measured_note(ctx: Context, names: list[str], data: dict[str, Any]) -> None:
    absent = [n for n in names if data[n] is None]
    if absent:
        where = ", ".join(ctx.measured_where(n) for n in absent)
        ctx.notes.append(f"Cells marked '{NOT_MEASURED}': {where} absent (the profiling stage writes these on a GPU; "
                         "no number is made up).")


def _fill_not_measured(rows: list[dict], columns: list[Column]) -> None:
    for row in rows:
        for c in columns:
            if c.kind == "ours" and row.get(c.name) is None:
                row[c.name] = NOT_MEASURED


def render_table3(ctx: Context, artifact) -> Table:
    """Table 3: model size and end-to-end GRPO step speedup over BF16 LoRA at batch 2, 4, 8 (no grad. ckpt)."""
    data = {n: ctx.measured(n) for n in ("e2e.csv", "memory.csv")}
    _not_measured_note(ctx, list(data), data)
    o = ctx.measured_label()
    peak = f"{o}: {_peak_column(data['memory.csv'])}"
    columns = [Column("model", "key"), Column("method", "key"), Column("W#", "key"),
               Column("paper: model size (GB)", "paper"),
               *[Column(f"paper: x bs{b}", "paper") for b in (2, 4, 8)],
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
        for method in ("lora", "qlora", "qerl"):
            mem = find_row(data["memory.csv"], method, model=model)
            row = {"model": model, "method": get_method(method).short, "W#": get_method(method).wbits,
                   f"{o}: model size (GB)": mem["model_size_gb"] if mem else NOT_MEASURED,
                   peak: mem["peak_gb"] if mem else NOT_MEASURED}
            row.update({f"{o}: step s bs{b}": _step_cell(data["e2e.csv"], model, method, b, False) for b in (2, 4, 8)})
            row.update({f"{o}: x bs{b}": speedup_cell(data["e2e.csv"], model, method, b, False) for b in (2, 4, 8)})
            ours.append(row)
    rows = _merge(rows, ours, ("model", "method"))
    _fill_not_measured(rows, columns)
    caption = (f"{artifact.caption} Ours: one measurement per cell from the committed profiling files. step s: "
               "seconds per GRPO step without gradient checkpointing (GC), as the paper's speedups are, or OOM when "
               "it ran out of GPU memory; x: BF16 LoRA step time / the method's, '-' for BF16 LoRA itself, OOM where "
               "the method ran out of memory, n/a where only BF16 LoRA did. The peak column is the peak memory of the step memory.csv names "
               "(with GC), so a model can show a peak next to OOM steps without GC.")
    return Table(artifact.id, artifact.title, caption, ctx.prov.fields(), columns, rows, list(ctx.notes))


def render_table5_8(ctx: Context, artifact) -> Table:
    """Tables 5-8 (3B, 7B, 14B, 32B): rollout tokens/s and speedups, E2E speedup without and with grad. ckpt."""
    model = paper.TABLE5_8_MODEL[artifact.id]
    data = {n: ctx.measured(n) for n in ("rollout.csv", "e2e.csv", "memory.csv")}
    _not_measured_note(ctx, list(data), data)
    o = ctx.measured_label()
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
    rollout = [r for r in data["rollout.csv"] or [] if r["model"] == model]
    batches = sorted({r["batch"] for r in rollout} | {r["batch"] for r in data["e2e.csv"] or [] if r["model"] == model})
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
            rollout_x = "-" if method == "lora" else (
                tps["tokens_per_s"] / ref["tokens_per_s"] if tps and ref else NOT_MEASURED)
            vals = [mem["model_size_gb"] if mem else NOT_MEASURED, tps["tokens_per_s"] if tps else NOT_MEASURED,
                    rollout_x if tps else NOT_MEASURED,
                    speedup_cell(data["e2e.csv"], model, method, batch, False),
                    speedup_cell(data["e2e.csv"], model, method, batch, True)]
            ours.append({"model": model, "method": get_method(method).short, "BS": batch,
                         "W#": get_method(method).wbits, **{f"{o}: {n}": v for n, v in zip(names, vals)}})
    rows = _merge(rows, ours, ("model", "method", "BS"))
    _fill_not_measured(rows, columns)
    if data["rollout.csv"] is not None and not rollout:
        ctx.notes.append(f"{ctx.measured_where('rollout.csv')} has no rows for {model}.")
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
    wlabel = {"lora": "BF16", "qerl": "NVFP4", "qlora": "NF4 (QLoRA)"}
    rank_specs = [s for s in ctx.needs.runs if s.variant.startswith("rank")]
    ranks = sorted(set(paper.TABLE9_RANKS) | {r["rank"] for r in measured or []}
                   | {int(s.variant[4:]) for s in rank_specs})
    columns = [Column("model", "key"), Column("W#", "key"),
               *[Column(f"paper: r{r}", "paper") for r in paper.TABLE9_RANKS],
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
            row = {"model": model, "method": method, "W#": wlabel[method]}
            row.update({f"ours: r{r['rank']}": r["tokens_per_s"] for r in cand if r["batch"] == batch})
            ours.append(row)
    rows = _merge(rows, ours, ("model", "method"))
    for row in rows:
        for r in ranks:
            if row.get(f"ours: r{r}") is None:
                row[f"ours: r{r}"] = NOT_MEASURED
    if rank_specs:
        row = {"model": ctx.model, "method": "qerl-runs", "W#": f"NVFP4, QeRL training rollouts ({ctx.scale})"}
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
               f"{runs_row}{paper.FIG11_NOTE}")
    return Table(artifact.id, artifact.title, caption, ctx.prov.fields(), columns, rows, list(ctx.notes))


# --------------------------------------------------------------------------------------------------- Table 4
# Table 4 row key -> our value, from the validated train section (workflow/schemas/config.schema.yaml fills every
# default; task entries hold the keys their config lists).
def _fmt(value: Any) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, (list, tuple)):
        return "/".join(_fmt(v) for v in value)
    return str(value)


def _per_task(train: dict, key: str) -> str:
    """The key's value in every task that sets it, qualified by the task name ("8 (tiny_grpo) / 16 (tiny_dapo)");
    NOT_CONFIGURED when no task sets it (the schema does not fill the defaults of a task's keys)."""
    found = [f"{_fmt(t[key])} ({name})" for name, t in train["tasks"].items() if key in t]
    return " / ".join(found) or NOT_CONFIGURED


def _lr(train: dict) -> str:
    by_method = [f"{_fmt(v)} ({k})" for k, v in train["lr_by_method"].items()]
    return " / ".join([f"{_fmt(train['lr'])} (default)"] + by_method)


def _rank(train: dict) -> str:
    ranks = train["ablations"]["ranks"]
    return f"{_fmt(train['lora']['rank'])} (main)" + (f", {_fmt(ranks)} in the ablation" if ranks else "")


TABLE4_VALUES: dict[str, Any] = {
    "optimizer": lambda t: _fmt(t["optimizer"]),
    "lr": _lr,
    "batch_size": lambda t: f"{t['prompts_per_step']} prompts",
    "group_size": lambda t: _per_task(t, "group_size"),
    "updates_per_rollout": lambda t: _per_task(t, "updates_per_rollout"),
    "max_response_length": lambda t: _per_task(t, "max_new_tokens"),
    "temperature": lambda t: _fmt(t["temperature"]),
    "clip_eps": lambda t: f"{_fmt(t['clip_eps_low'])}, {_fmt(t['clip_eps_high'])}",
    "sigma": lambda t: f"{_fmt(t['aqn']['sigma_start'])}, {_fmt(t['aqn']['sigma_end'])} ({t['aqn']['schedule']})",
    "aqn_stages": lambda t: _fmt(t["aqn"]["stages"]),
    "lora_rank": _rank,
}


def config_value(train: dict, key: str) -> str:
    """Our value of the Table 4 row `key` from the config's train section.

    Args:
        train: the validated config's train section.
        key: a Table 4 row key (paper.TABLE4[i]["key"]).

    Returns:
        The value as text (per-task values qualified by the task name; NOT_CONFIGURED when no task sets it).
    """
    return TABLE4_VALUES[key](train)


def render_table4(ctx: Context, artifact) -> Table:
    """Table 4: the paper's hyperparameters beside the config actually used (its train section)."""
    train = ctx.cfg["train"]
    ours = f"{ctx.ours()}: config"
    columns = [Column("hyperparameter", "key"), Column("paper", "paper"), Column(ours, "ours")]
    rows = [{"hyperparameter": r["label"], "paper": r["paper"], ours: config_value(train, r["key"])}
            for r in paper.TABLE4]
    missing = [r["hyperparameter"] for r in rows if r[ours] == NOT_CONFIGURED]
    if missing:
        ctx.notes.append(f"Not in this config's train section: {', '.join(missing)}.")
    caption = (f"{artifact.caption} Ours: read from the config this render was given (train section); per-task "
               f"values are qualified by the task name. Training steps per run: {train['steps']}.")
    return Table(artifact.id, artifact.title, caption, ctx.prov.fields(), columns, rows, list(ctx.notes))
