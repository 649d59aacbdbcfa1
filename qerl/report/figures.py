"""Figure renderers (Figures 1, 3, 4, 5, 7-17) and the PNG / PDF writer.

Why: the paper's training-dynamics claims (entropy, reward growth, AQN, schedules, ranks, learning rates) are
curves; ours are drawn from the runs' metrics.jsonl with the spread over seeds, and the paper's numbers are drawn
beside ours wherever the paper prints them (Fig. 1 and Fig. 11 bars, taken from Tables 1, 3, 6 and 9; Fig. 15's
schedules, from Eq. 8 and Table 4's range).

How:
- Curves: each seed's values are smoothed with an exponential moving average (EMA) of span
  max(2, steps // 20): pandas' `ewm(span, adjust=True)`, alpha = 2 / (span + 1), bias-corrected so the first
  points are not pulled towards zero; NaNs are skipped (the weights decay over them). The line is the mean over
  seeds of the smoothed values, the shaded band spans their minimum and maximum over seeds (the spread), and the
  faint line is the unsmoothed mean.
  AQN's sigma is a step function and is drawn unsmoothed.
- Seeds are aligned by step (the union of logged steps; a seed without a step is left out of that step's statistics).
- Every figure's title names the scale and model; a footer carries seeds, commit, hardware and the paper's own
  description of the figure. Matplotlib runs on the Agg backend (no display), imported only when a figure is drawn.

Run: `qerl render --config config/config.yaml --artifact fig8`.
"""
from __future__ import annotations

import io
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from qerl.contract import paths
from qerl.contract.methods import METHODS, SPEED_METHODS
from qerl.io import write_bytes
from qerl.report import paper
from qerl.report.context import Context, RunSpec, ablation, role_benchmarks
from qerl.report.speed import NOT_MEASURED, e2e_speedup, method_aliases

__all__ = [
    "Panel", "ema_span", "seed_band", "render_curves", "draw_paper_schedules", "render_fig1", "render_fig11",
    "write_figure", "pyplot", "figure_title", "measured_line", "figure_footer",
]


def pyplot():
    """matplotlib.pyplot on the Agg backend (no display; imported on first use)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def ema_span(n_steps: int) -> int:
    """The EMA span used for a curve of `n_steps` points: max(2, n_steps // 20)."""
    return max(2, n_steps // 20)


def seed_band(per_seed: list[dict[str, list[float]]], metric: str, smooth: bool):
    """Align seeds by step and summarise: (steps, mean, low, high, raw mean) as numpy arrays.

    Args:
        per_seed: metric columns of each seed (qerl.report.inputs.read_metrics).
        metric: the column to draw.
        smooth: EMA-smooth each seed before taking mean / min / max.

    Raises:
        ValueError: when `metric` is not a column of the metrics.
    """
    import pandas as pd

    for m in per_seed:
        if metric not in m:
            raise ValueError(f"metric {metric!r} is not in the run's metrics (columns: {sorted(m)})")
    # one column per seed, one row per step of any seed (NaN where a seed has no value)
    raw = pd.concat([pd.Series(m[metric], index=[int(s) for s in m["step"]], dtype=float) for m in per_seed],
                    axis=1).sort_index()
    smoothed = raw.ewm(span=ema_span(len(raw)), adjust=True).mean().where(raw.notna()) if smooth else raw
    # pandas skips NaN: a step no seed logged gives NaN
    return (raw.index.to_numpy(), smoothed.mean(axis=1).to_numpy(), smoothed.min(axis=1).to_numpy(),
            smoothed.max(axis=1).to_numpy(), raw.mean(axis=1).to_numpy())


@dataclass(frozen=True)
class Panel:
    """One axes of a curve figure: `metric` of the runs of task `role` (None = every run the artifact needs).

    `draw(ax, ctx)`, when given, draws the axes instead (e.g. the paper's schedules in Fig. 15).
    """

    metric: str
    title: str
    role: str | None = None
    smooth: bool = True
    ylabel: str = ""
    draw: Callable | None = None
    log: bool = False  # log y axis (values <= 0 are not drawn)


def _label(spec: RunSpec) -> str:
    if spec.label:
        return spec.label
    base = METHODS[spec.method].label if spec.method in METHODS else spec.method
    return base if spec.variant == "default" else f"{base}, {spec.variant}"


def _runs_line(ctx: Context) -> str:
    """"tiny scale, model tiny, seeds 0, 1, 2": what our curves and accuracy bars are, from the runs read."""
    seeds = ctx.read_seeds()
    what = f"seed {seeds[0]}" if len(seeds) == 1 else f"seeds {', '.join(map(str, seeds))}"
    return f"{ctx.scale} scale, model {ctx.model}, {what}"


def measured_line(ctx: Context, models: list[str] | None = None) -> str:
    """Where the measured numbers of `models` (default: every measured model) come from, for a figure's title:
    "measured on h100 (results/measured/h100)", or per model when their GPUs differ."""
    folders = list(dict.fromkeys(f for m, f in ctx.measured_sources().items() if models is None or m in models))
    if not folders:
        return NOT_MEASURED
    if len(folders) == 1:
        return f"measured on {folders[0].name} ({folders[0]})"
    return f"measured per model: {ctx.measured_gpus_line(models=models)}"


def figure_title(artifact, ctx: Context, ours: str | None = None) -> str:
    """The artifact's title, and a line saying what our part is (default: the runs it reads)."""
    return f"{artifact.title}\nours: {ours or _runs_line(ctx)}"


def figure_footer(fig, artifact, ctx: Context, extra: str = "") -> None:
    """The provenance line and the paper's description of the figure under it (and `extra`)."""
    text = ctx.prov.line()
    desc = paper.FIGURES.get(artifact.id)
    if desc:
        text += f"\nPaper ({paper.PAPER_ID}): {desc}"
    if artifact.same_data:
        text += f"\n{artifact.same_data}"
    for note in ctx.notes + ([extra] if extra else []):
        text += f"\n{note}"
    width, height = fig.get_size_inches()  # margins in inches, so every figure size gets the same room
    wrapped = "\n".join(textwrap.fill(line, int(width * 19)) for line in text.splitlines())
    fig.text(0.01, 0.005, wrapped, fontsize=5.5, va="bottom", ha="left", color="0.3")
    n_lines = wrapped.count("\n") + 1
    fig.subplots_adjust(bottom=min(0.45, (0.55 + 0.1 * n_lines) / height), top=1 - 0.75 / height,
                        left=0.75 / width, right=1 - 0.3 / width, wspace=0.3, hspace=0.45)


def render_curves(ctx: Context, artifact, panels: list[Panel], layout: str = "cols"):
    """Curves of the artifact's runs, one axes per panel, mean over seeds with a min-max band.

    Args:
        ctx: the render context (the runs are `ctx.needs.runs` with file metrics.jsonl).
        artifact: the registry entry (title, id).
        panels: what each axes shows.
        layout: "cols" (side by side) or "rows" (stacked).

    Returns:
        The matplotlib Figure.
    """
    plt = pyplot()
    n = len(panels)
    shape = (1, n) if layout == "cols" else (n, 1)
    size = (max(6.4, 5.2 * n), 4.8) if layout == "cols" else (6.4, 3.3 * n + 1.2)
    fig, axes = plt.subplots(*shape, figsize=size, squeeze=False)
    specs = [s for s in ctx.needs.runs if s.file == paths.METRICS_FILE]
    cache: dict[RunSpec, list] = {}
    cycle = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    curves = list(dict.fromkeys((s.method, s.variant) for s in specs))  # one color per curve across panels
    colors = {c: cycle[i % len(cycle)] for i, c in enumerate(curves)}
    counts: set[int] = set()
    for ax, panel in zip(axes.flat, panels):
        ax.set_title(panel.title, fontsize=9)
        ax.set_xlabel("step")
        ax.set_ylabel(panel.ylabel or panel.metric)
        ax.grid(alpha=0.3)
        if panel.draw is not None:
            panel.draw(ax, ctx)
            continue
        chosen = [s for s in specs if panel.role is None or s.role == panel.role]
        drawn = 0
        for spec in chosen:
            if spec not in cache:
                cache[spec] = ctx.metrics(spec)
            per_seed = cache[spec]
            if not per_seed:
                continue
            counts.add(len(per_seed))
            steps, mean, low, high, raw = seed_band(per_seed, panel.metric, panel.smooth)
            color = colors[(spec.method, spec.variant)]
            ax.plot(steps, mean, color=color, lw=1.6, label=f"{_label(spec)} (n={len(per_seed)})")
            if len(per_seed) > 1:
                ax.fill_between(steps, low, high, color=color, alpha=0.18, lw=0)
            if panel.smooth:
                ax.plot(steps, raw, color=color, lw=0.6, alpha=0.3)
            drawn += 1
        if drawn and panel.log:
            ax.set_yscale("log")
        if drawn:
            ax.legend(fontsize=7)
        else:
            ax.text(0.5, 0.5, "no runs", ha="center", va="center", transform=ax.transAxes)
    ours = None
    if len(counts) > 1:  # a comparison of unequal seed counts says so, in the title and the footer
        ours = f"{_runs_line(ctx)}; curves average {' or '.join(map(str, sorted(counts)))} seeds (n in the legend)"
        ctx.notes.append("The curves do not average the same number of seeds: compare them with that in mind.")
    fig.suptitle(figure_title(artifact, ctx, ours), fontsize=10)
    smooth_note = ("Lines: mean over seeds of EMA-smoothed values (span = max(2, steps // 20)); band: min-max over "
                   "seeds; faint: unsmoothed mean.")
    figure_footer(fig, artifact, ctx, smooth_note)
    return fig


def draw_paper_schedules(ax, ctx: Context) -> None:
    """The paper's AQN schedules (Eq. 8 and the three alternatives, Table 4's sigma range, K = 10) over as many
    steps as our longest schedule-ablation run (100 when there is none)."""
    from qerl.noise.schedule import sigma_at

    total = 0
    for spec in ctx.needs.runs:
        for m in ctx.metrics(spec):
            total = max(total, int(m["step"][-1]) + 1)
    total = total or 100
    s_start, s_end = paper.SIGMA_RANGE
    for kind in ablation(ctx.cfg, "aqn_schedules"):
        ax.plot(range(total), [sigma_at(t, total, paper.AQN_STAGES, s_start, s_end, kind) for t in range(total)],
                lw=1.4, label=kind)
    ax.legend(fontsize=7)


def _bar_label(value: float) -> str:
    """A bar's value as printed above it: whole numbers from 100 up (tokens/s), else three significant digits."""
    return f"{value:.0f}" if abs(value) >= 100 else f"{value:.3g}"


def _bars(ax, groups: list[str], series: list[tuple[str, dict[str, Any], dict]], ylabel: str,
          legend: bool = True) -> None:
    """Grouped bars: one group per x label, one bar per series (label, {group: value or (mean, lo, hi, points)});
    legend=False leaves the legend to the caller (one figure legend for several panels). With more than three
    series the value labels stand upright, so that neighbouring bars' labels do not overlap."""
    import numpy as np

    width = 0.8 / max(1, len(series))
    upright = len(series) > 3
    x = np.arange(len(groups))
    for j, (label, values, style) in enumerate(series):
        pos = x - 0.4 + width * (j + 0.5)
        for i, g in enumerate(groups):
            v = values.get(g)
            if v is None:
                continue
            if isinstance(v, tuple):
                mean, lo, hi, points = v
                ax.bar(pos[i], mean, width, yerr=[[mean - lo], [hi - mean]], capsize=2,
                       label=label if i == min(k for k, gg in enumerate(groups) if gg in values) else None, **style)
                ax.scatter([pos[i]] * len(points), points, s=6, color="k", zorder=3)
            else:
                ax.bar(pos[i], v, width, label=label if i == min(k for k, gg in enumerate(groups) if gg in values)
                       else None, **style)
                ax.annotate(_bar_label(v), (pos[i], v), ha="center", va="bottom", fontsize=6,
                            rotation=90 if upright else 0, xytext=(0, 1), textcoords="offset points")
    ax.set_xticks(x)
    ax.set_xticklabels(groups, fontsize=8)
    ax.set_ylabel(ylabel)
    ax.grid(axis="y", alpha=0.3)
    tops = [v[2] if isinstance(v, tuple) else v for _, values, _ in series for v in values.values()]
    if tops:  # headroom above the bars for their labels and for the legend (one entry per line: it stays inside)
        ax.set_ylim(0, (1.45 if legend else 1.2) * max(tops))
    if series and legend:
        ax.legend(fontsize=6, loc="upper center", ncol=1, framealpha=0.9)


_PAPER_STYLE = {"color": "0.55"}
_OURS_STYLE = {"color": "tab:blue", "hatch": "//", "edgecolor": "white"}
_NAMES = {m: METHODS[m].short for m in (*SPEED_METHODS, "full")}  # the efficiency tables' labels


def _pick_model_batch(rows: list[dict], model: str, batch: int) -> tuple[str, int] | None:
    if not rows:
        return None
    models = [r["model"] for r in rows]
    m = model if model in models else models[0]
    batches = sorted({r["batch"] for r in rows if r["model"] == m})
    return m, (batch if batch in batches else batches[-1])


def render_fig1(ctx: Context, artifact):
    """Fig. 1: rollout speed, E2E speedup (batch 8) and accuracy of LoRA, QLoRA, QeRL, full: paper vs ours."""
    plt = pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.8))
    sources = ctx.measured_sources()
    shown = "7B" if "7B" in sources else next(iter(sources), None)  # the paper's model, else the first measured
    rollout, e2e = ctx.measured("rollout.csv", shown), ctx.measured("e2e.csv", shown)  # its GPU's files alone
    o = ctx.measured_label(shown)
    groups = ["LoRA", "QLoRA", "QeRL", "Full"]
    # (a) rollout tokens/s
    ours_tps, where = {}, NOT_MEASURED
    pick = _pick_model_batch(rollout or [], "7B", 8)
    if pick:
        model, batch = pick
        where = f"{model}, batch {batch}"
        for method in SPEED_METHODS:
            cand = [r for r in rollout if r["model"] == model and r["batch"] == batch
                    and r["method"] in method_aliases(method)]
            v = min(cand, key=lambda r: r["rank"])["tokens_per_s"] if cand else None
            if isinstance(v, float):  # not "OOM"
                ours_tps[_NAMES[method]] = v
    paper_tps = {_NAMES[k]: v for k, v in paper.FIG1["rollout_tps_bs8"].items()}
    _bars(axes[0], groups[:3], [("paper (7B, bs 8)", paper_tps, _PAPER_STYLE),
                                (f"{o} ({where})", ours_tps, _OURS_STYLE)], "rollout tokens/s")
    axes[0].set_title("rollout throughput", fontsize=9)
    # (b) E2E speedup
    ours_x, where, gc_note = {}, NOT_MEASURED, ""
    pick = _pick_model_batch(e2e or [], "7B", 8)
    if pick:
        model, batch = pick
        where = f"{model}, batch {batch}"
        for gc in (False, True):  # the paper's rows are without gradient checkpointing; with it if BF16 LoRA OOMs
            ours_x = {}
            for method in SPEED_METHODS:
                v = e2e_speedup(e2e, model, method, batch, gc)
                if v == "-":
                    v = 1.0
                if isinstance(v, float):
                    ours_x[_NAMES[method]] = v
            if _NAMES["lora"] in ours_x:
                if gc:
                    where += ", with GC"
                    gc_note = (f" Ours E2E: with gradient checkpointing (GC), since BF16 LoRA runs out of memory "
                               f"without it at {model}, batch {batch}.")
                break
    paper_x = {_NAMES[k]: v for k, v in paper.FIG1["e2e_x_bs8"].items()}
    _bars(axes[1], groups[:3], [("paper (7B, bs 8)", paper_x, _PAPER_STYLE), (f"{o} ({where})", ours_x, _OURS_STYLE)],
          "E2E speedup over BF16 LoRA")
    axes[1].set_title("end-to-end GRPO step", fontsize=9)
    absent = []
    for ax, data, name in ((axes[0], rollout, "rollout.csv"), (axes[1], e2e, "e2e.csv")):
        if data is None:
            ax.set_title(f"{ax.get_title()} (ours: {NOT_MEASURED})", fontsize=9, color="tab:red")
            absent.append(ctx.measured_where(name, shown))
    # (c) accuracy
    bench = role_benchmarks(ctx.cfg, "grpo")[0]
    ours_acc = {}
    for method in ("lora", "qlora", "qerl", "full"):
        spec = RunSpec("grpo", method, "default", paths.EVAL_FILE)
        if spec in ctx.needs.runs:
            per_seed = ctx.run_evals(spec, [bench])
            if per_seed:
                pts = [s[bench].pass_at_1 for s in per_seed]
                ours_acc[_NAMES[method]] = (sum(pts) / len(pts), min(pts), max(pts), pts)
    paper_acc = {_NAMES[k]: v for k, v in paper.FIG1["gsm8k"].items()}
    _bars(axes[2], groups, [("paper: GSM8K (7B)", paper_acc, _PAPER_STYLE),
                            (f"ours ({ctx.scale}): {bench}", ours_acc, _OURS_STYLE)], "pass@1 (%)")
    axes[2].set_title("accuracy after GRPO (ours: mean, min-max bar, seeds as dots)", fontsize=9)
    speed = measured_line(ctx, [shown]) if shown else NOT_MEASURED
    fig.suptitle(figure_title(artifact, ctx, f"speed {speed}; accuracy: {_runs_line(ctx)}"), fontsize=10)
    extra = "Paper bars are the values of Tables 1, 3 and 6 (7B, batch 8)." + gc_note
    if absent:
        extra += f" Ours not measured: {', '.join(absent)} absent."
    figure_footer(fig, artifact, ctx, extra)
    return fig


def render_fig11(ctx: Context, artifact):
    """Fig. 11: rollout tokens/s at batch 1 by LoRA rank per model: paper (Table 9) vs ours (measured)."""
    plt = pyplot()
    rollout = ctx.measured("rollout.csv")
    models = list(dict.fromkeys([r["model"] for r in paper.TABLE9] + [r["model"] for r in rollout or []]))
    fig, axes = plt.subplots(1, len(models), figsize=(4.2 * len(models), 5.0), squeeze=False)
    o = ctx.measured_label()
    wname = {"lora": "BF16", "qerl": "NVFP4", "qlora": "QLoRA"}
    for ax, model in zip(axes.flat, models):
        ranks = sorted({r["rank"] for r in paper.TABLE9 if r["model"] == model}
                       | {r["rank"] for r in rollout or [] if r["model"] == model})
        groups = [f"r{r}" for r in ranks]
        series = []
        for method in ("lora", "qerl", "qlora"):
            pv = {f"r{r['rank']}": r["tokens_per_s"] for r in paper.TABLE9
                  if r["model"] == model and r["method"] == method}
            if pv:
                series.append((f"paper {wname[method]}", pv, {"color": METHODS[method].color}))
            cand = [r for r in rollout or [] if r["model"] == model and r["method"] in method_aliases(method)]
            if cand:
                batch = 1 if any(r["batch"] == 1 for r in cand) else min(r["batch"] for r in cand)
                ov = {f"r{r['rank']}": r["tokens_per_s"] for r in cand
                      if r["batch"] == batch and isinstance(r["tokens_per_s"], float)}
                series.append((f"{o} {wname[method]} (bs {batch})", ov,
                               {"color": METHODS[method].color, "hatch": "//", "edgecolor": "white"}))
        _bars(ax, groups, series, "rollout tokens/s", legend=False)
        if rollout is None or not any(r["model"] == model for r in rollout):
            ax.set_title(f"{model} (ours: {NOT_MEASURED})", fontsize=9, color="tab:red")
        else:
            ax.set_title(f"{model} (ours: {ctx.measured_gpu(model)})" if ctx.measured_mixed() else model, fontsize=9)
    fig.suptitle(figure_title(artifact, ctx, measured_line(ctx)), fontsize=10)
    gpus = ctx.measured_gpus_line("rollout.csv")
    extra = (f"Ours not measured: {ctx.measured_where('rollout.csv')} absent." if rollout is None else
             f"Ours, GPU per model (in each panel's title): {gpus}." if gpus else "")
    figure_footer(fig, artifact, ctx, extra)
    entries = {}  # one legend for all panels: every series label once
    for ax in axes.flat:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            entries.setdefault(label, handle)
    height = fig.get_size_inches()[1]
    fig.legend(list(entries.values()), list(entries.keys()), loc="upper center", ncol=min(6, len(entries)),
               fontsize=7, frameon=False, bbox_to_anchor=(0.5, 1 - 0.45 / height))
    fig.subplots_adjust(top=1 - 1.0 / height)
    return fig


def write_figure(fig, out_dir: str | Path, artifact_id: str, title: str = "", subject: str = "") -> list[Path]:
    """Save `fig` as <out_dir>/<id>.png and .pdf atomically (no creation date, so reruns are comparable).

    Returns:
        The two paths.
    """
    plt = pyplot()
    out_dir = Path(out_dir)
    paths = []
    for ext, meta in (("png", {"Title": title, "Description": subject}),
                      ("pdf", {"Title": title, "Subject": subject, "CreationDate": None})):
        buf = io.BytesIO()
        fig.savefig(buf, format=ext, dpi=150, metadata=meta)
        paths.append(write_bytes(out_dir / f"{artifact_id}.{ext}", buf.getvalue()))
    plt.close(fig)
    return paths
