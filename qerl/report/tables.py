"""The Table model and its four file formats (Markdown, LaTeX, CSV, HTML): what every table renderer returns and
how it is written.

Why: every paper table is printed with the paper's numbers in "paper: ..." columns and ours in "ours (<scale>): ..."
columns, never in the same column, with a header line naming scale, model, seeds, commit and hardware.

The renderers: qerl/report/accuracy_tables.py (Tables 1, 2 and 4), qerl/report/efficiency_tables.py (Tables 3, 5-8
and 9), qerl/report/beyond.py (the AQN table). Rows are keyed by model and method; our rows go into the paper row
with the same keys, or form rows of their own (merge_rows).

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
from qerl.report.inputs import Stat

__all__ = [
    "Column",
    "Table",
    "format_value",
    "over_seeds",
    "merge_rows",
    "to_markdown",
    "to_latex",
    "to_csv",
    "to_html",
    "html_page",
    "write_table",
]


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


def merge_rows(rows: list[dict], ours: list[dict], keys: tuple[str, ...]) -> list[dict]:
    """Put each of our rows into the paper row with the same keys, or append it as a row of its own."""
    index = {tuple(r.get(k) for k in keys): r for r in rows}
    for row in ours:
        target = index.get(tuple(row.get(k) for k in keys))
        if target is None:
            rows.append(row)
        else:
            target.update({k: v for k, v in row.items() if k not in target or k.startswith("ours")})
    return rows
