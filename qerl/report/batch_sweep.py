"""The rollout speed claim across batch sizes: QeRL and QLoRA speedup over BF16 LoRA from batch 1 to 256, against
the speedup the hardware allows, and a verdict per batch regime.

Why: the paper's first claim (NVFP4 rollouts > 1.5x BF16 LoRA) is measured at batch 1-8; RL rolls out far larger
batches (the paper config samples 128 prompts x 8 in 64-row chunks), where decoding stops being bound by reading the
weights. This artifact ("figbatch", not a paper figure) plots the measured ratio per batch beside two ceilings:

  * roofline: per decode step, time >= max(bytes / read bandwidth, FLOPs / matrix rate), where bytes are the
    weights (BF16: 2 bytes per weight; NVFP4: 4.5 bits plus the BF16 LM head), the LoRA factors and the KV cache of
    every row at the generation's mean context (prompt + completion / 2), and FLOPs are 2 per weight per row plus
    attention; the ceiling is BF16's floor over NVFP4's;
  * weights only: the same without the KV cache (the ratio the 4-bit weights alone would buy).
Bandwidth and matrix rate come from results/measured/<gpu>/ceilings.json (measured on that GPU, with provenance
inside) of the folder the ceilings' model (7B, else the first plotted) was measured in, so the ceilings and the ratios
they bound are of one GPU; without that file only the measured ratios are drawn. Each model's rows come from its own
folder (qerl/report/context.py); when the models' GPUs differ, every label names its model's GPU ("7B (h100)").

Regimes (`regime_verdicts`, also used by `qerl claims`): batch <= 8, 16-64, >= 128; "holds" where every measured
ratio of the regime is >= 1.5, otherwise "not reproduced", said with whether QeRL is still faster than BF16 LoRA
there ("faster, below 1.5x"), slower ("slower"), or both ("mixed"). Where BF16 LoRA ran out of memory at a batch
QeRL was measured at (32B on an 80 GB card from batch 16), the regime says so with QeRL's tok/s ("BF16 LoRA out of
memory"): no ratio, and the model still counts as swept when QeRL's rows reach batch 64.

Run: `qerl render --config results/tiny/config.yaml --artifact figbatch --out results/tiny/figures`
"""
from __future__ import annotations

import json
from pathlib import Path

from qerl.contract.methods import METHODS
from qerl.report.context import Context
from qerl.report.speed import NOT_MEASURED, method_aliases

__all__ = ["REGIMES", "PAPER_CLAIM", "MEAN_CONTEXT", "ceilings", "step_floor", "speedups", "baseline_oom",
           "swept_models", "regime_verdicts",
           "sweep_claim_lines", "render_figbatch"]

REGIMES = (("batch <= 8", 1, 8), ("batch 16-64", 16, 64), ("batch >= 128", 128, 1 << 30))
PAPER_CLAIM = 1.5  # "> 1.5x rollout speedup" (QeRL abstract / Tables 5-8)
MEAN_CONTEXT = 256 + 2048 / 2  # the profile's shape: prompt 256, completion 2048 (mean context over a generation)
_BITS = {"lora": 16.0, "qerl": 4.5, "qlora": 4.127}  # NF4: 4 bits + 8-bit absmax per 64 + fp32 per 256 blocks


def ceilings(folder: Path | None) -> dict | None:
    """{"read_gbs", "tflops", "source"} from <folder>/ceilings.json (a measured/<gpu>/ folder), or None when absent.

    Raises:
        ValueError: naming the file when it lacks the read_gbs or tflops number.
    """
    path = folder / "ceilings.json" if folder is not None else None
    if path is None or not path.exists():
        return None
    try:
        data = json.loads(path.read_text())
        return {"read_gbs": float(data["read_gbs"]), "tflops": float(data["tflops"]),
                "source": f"{path}: {data.get('source', '')}"}
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{path}: expected read_gbs and tflops numbers ({exc})") from exc


def _arch(model: str):
    """The architecture of a paper model label ("7B") or a full model name."""
    from qerl.profiling.archs import ARCHS
    if model in ARCHS:
        return ARCHS[model]
    return next((a for a in ARCHS.values() if a.model_name == model), None)


def step_floor(arch, method: str, batch: int, context: float, read_gbs: float, tflops: float, *, rank: int = 32,
               kv: bool = True) -> float:
    """Seconds per decode step no implementation can beat (see the module docstring).

    Args:
        arch: a qerl.profiling.archs.Arch.
        method: "lora" (BF16 weights), "qerl" (NVFP4) or "qlora" (NF4).
        batch: rows per step; context: mean tokens each row attends over.
        read_gbs, tflops: measured read bandwidth (GB/s) and bf16 matrix rate (TFLOP/s).
        kv: count the KV cache reads (False: weights and LoRA only).
    """
    head = arch.vocab * arch.hidden  # the LM head (tied or not) is read every step, in BF16
    kv_dim = arch.kv_heads * arch.head_dim
    per_layer_lora = rank * (4 * arch.hidden + arch.hidden + 2 * kv_dim + 3 * (arch.hidden + arch.intermediate)
                             + (arch.hidden + arch.intermediate))
    lora = per_layer_lora * arch.layers
    weight_bytes = arch.linear_params * _BITS[method] / 8 + 2 * head + 2 * lora
    kv_bytes = batch * context * arch.layers * 2 * kv_dim * 2 if kv else 0.0
    flops = 2 * batch * (arch.linear_params + head + lora) + 4 * batch * context * arch.layers * arch.hidden
    return max((weight_bytes + kv_bytes) / (read_gbs * 1e9), flops / (tflops * 1e12))


def _first_rows(rows: list[dict], model: str, method: str, rank: int) -> dict[int, object]:
    """{batch: tokens_per_s of the first row} of one model, method and LoRA rank (the profiler writes the bucket
    timing before the full-generation one, which agrees with it within ~1 %; an OOM row is a batch's only row)."""
    out: dict[int, object] = {}
    for r in rows:
        if r["model"] == model and r["method"] in method_aliases(method) and r["rank"] == rank:
            out.setdefault(r["batch"], r["tokens_per_s"])
    return out


def speedups(rows: list[dict], model: str, method: str, rank: int = 32) -> dict[int, float]:
    """{batch: method tok/s / BF16 LoRA tok/s} from rollout.csv rows at one LoRA rank (`_first_rows`)."""
    base, ours = (_first_rows(rows, model, m, rank) for m in ("lora", method))
    return {b: float(ours[b]) / float(base[b]) for b in sorted(ours)
            if _measured(ours[b]) and _measured(base.get(b)) and base[b] > 0}


def baseline_oom(rows: list[dict], model: str, method: str, rank: int = 32) -> dict[int, float]:
    """{batch: method tok/s} where the method was measured and BF16 LoRA's row at that batch and rank says OOM."""
    base, ours = (_first_rows(rows, model, m, rank) for m in ("lora", method))
    return {b: float(v) for b, v in sorted(ours.items()) if _measured(v) and str(base.get(b)).upper() == "OOM"}


def _measured(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def swept_models(rows: list[dict]) -> list[str]:
    """The models with a batch sweep: QeRL measured at three or more batch sizes up to 64 or more, each beside a
    BF16 LoRA row (a ratio, or BF16 LoRA out of memory)."""
    out = []
    for model in dict.fromkeys(r["model"] for r in rows):
        batches = [*speedups(rows, model, "qerl"), *baseline_oom(rows, model, "qerl")]
        if len(batches) >= 3 and max(batches) >= 64:
            out.append(model)
    return out


def regime_verdicts(ratios: dict[int, float], oom: dict[int, float] | None = None) -> list[tuple[str, str, str, str]]:
    """[(regime, "min-max x over n batches", verdict, short verdict)] for the regimes that have measurements;
    `oom` ({batch: QeRL tok/s} where BF16 LoRA ran out of memory, `baseline_oom`) names those batches, and gives a
    regime with no ratio the verdict "BF16 LoRA out of memory"."""
    out = []
    for name, lo, hi in REGIMES:
        xs = [v for b, v in ratios.items() if lo <= b <= hi]
        gone = {b: v for b, v in (oom or {}).items() if lo <= b <= hi}
        qerl_tps = (f"QeRL {', '.join(f'{v:,.0f}' for v in gone.values())} tok/s at batch "
                    f"{', '.join(map(str, gone))}")
        if not xs:
            if gone:
                out.append((name, qerl_tps, "not comparable: BF16 LoRA out of memory where QeRL runs",
                            "BF16 LoRA out of memory"))
            continue
        oom_note = f"; BF16 LoRA out of memory at batch {', '.join(map(str, gone))} ({qerl_tps})" if gone else ""
        if min(xs) >= PAPER_CLAIM:
            verdict, short = "holds", "holds"
        elif max(xs) <= 1.0:
            verdict, short = "not reproduced (no faster than BF16 LoRA)", "slower"
        elif min(xs) > 1.0:
            verdict, short = f"not reproduced (faster than BF16 LoRA, below {PAPER_CLAIM:g}x)", "faster, below 1.5x"
        else:
            verdict, short = "not reproduced (faster at some batches, slower at others)", "mixed"
        span = (f"{xs[0]:.2f}x at 1 batch size" if len(xs) == 1
                else f"{min(xs):.2f}-{max(xs):.2f}x over {len(xs)} batch sizes")
        out.append((name, span + oom_note, verdict, short))
    return out


def sweep_claim_lines(ctx: Context) -> tuple[list[str], str] | None:
    """Markdown lines and a one-line summary of the per-regime verdicts of every model with a batch sweep (QeRL and
    BF16 LoRA measured at three or more batch sizes, up to 64 or more); None when there is none."""
    rows = ctx.measured("rollout.csv") or []
    lines, summary, swept = [], [], []
    for model in swept_models(rows):
        q, oom = speedups(rows, model, "qerl"), baseline_oom(rows, model, "qerl")
        swept.append(model)
        ql = speedups(rows, model, "qlora")
        label = ctx.measured_model(model)
        lines.append(f"- {label}, QeRL / BF16 LoRA rollout tok/s by batch: " +
                     ", ".join(f"{b}: {v:.2f}" for b, v in q.items()) +
                     ("; QLoRA / BF16 LoRA: " + ", ".join(f"{b}: {v:.2f}" for b, v in ql.items()) if ql else ""))
        verdicts = regime_verdicts(q, oom)
        lines += [f"  - {name}: {span}: **{verdict}**" for name, span, verdict, _ in verdicts]
        summary.append(f"{label}: " + "; ".join(f"{name} {short} ({span.split(' over')[0].split('; ')[0]})"
                                                 for name, span, _, short in verdicts))
    if not lines:
        return None
    gpus = ctx.measured_gpus_line("rollout.csv", models=swept)
    where = f"; GPU per model: {gpus}" if gpus else ""
    head = f"Across batch sizes (figure figbatch; rank 32, the same rollout.csv{where}):"
    return [head, "", *lines, ""], " | ".join(summary)


def render_figbatch(ctx: Context, artifact):
    """Two panels: speedup over BF16 LoRA vs batch (measured QeRL and QLoRA, roofline and weights-only ceilings,
    the paper's 1.5x); rollout tokens/s vs batch with each method's roofline tokens/s."""
    from qerl.report import figures

    plt = figures.pyplot()
    rows = ctx.measured("rollout.csv") or []
    # the models with a sweep (`swept_models`); others (batch 1-8) are in Tables 5-8 and Fig. 11
    models = swept_models(rows)
    ceiling_model = "7B" if "7B" in models else (models[0] if models else None)
    ceil = ceilings(ctx.measured_sources().get(ceiling_model))  # the ceilings of the GPU that model was measured on
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(11.0, 6.4))
    styles = ["-", "--", ":", "-."]
    for i, model in enumerate(models):
        label = ctx.measured_model(model)
        ls = styles[i % len(styles)]
        for method in ("qerl", "qlora"):
            s = speedups(rows, model, method)
            if s:
                ax.plot(list(s), list(s.values()), ls, marker="o", ms=4, color=METHODS[method].color,
                        label=f"{label} {METHODS[method].speed} (measured)")
        for method in ("lora", "qerl", "qlora"):
            pts = sorted((b, float(v)) for b, v in _first_rows(rows, model, method, 32).items() if _measured(v))
            if pts:
                ax2.plot([b for b, _ in pts], [v for _, v in pts], ls, marker="o", ms=4, color=METHODS[method].color,
                         label=f"{label} {METHODS[method].speed}")
        arch = _arch(model)
        ctx_len = MEAN_CONTEXT
        if ceil and arch is not None and model == ceiling_model:
            batches = [2 ** k for k in range(0, 9)]
            for kv, style, what in ((True, "-", "roofline (weights + LoRA + KV cache)"),
                                    (False, ":", "weights only")):
                ratio = [step_floor(arch, "lora", b, ctx_len, ceil["read_gbs"], ceil["tflops"], kv=kv) /
                         step_floor(arch, "qerl", b, ctx_len, ceil["read_gbs"], ceil["tflops"], kv=kv)
                         for b in batches]
                ax.plot(batches, ratio, style, color="black", lw=1.0, alpha=0.6,
                        label=f"{label} ceiling, NVFP4 vs BF16: {what}")
            for method in ("lora", "qerl"):
                ax2.plot(batches, [b / step_floor(arch, method, b, ctx_len, ceil["read_gbs"], ceil["tflops"])
                                   for b in batches], "-", color=METHODS[method].color, lw=0.8, alpha=0.35,
                         label=f"{label} {METHODS[method].speed} roofline")
    ax.axhline(PAPER_CLAIM, color="tab:red", ls="--", lw=1, label="paper: > 1.5x")
    ax.axhline(1.0, color="0.5", lw=0.8)
    for a in (ax, ax2):
        a.set_xscale("log", base=2)
        a.set_xlabel("rollout batch (sequences)")
        a.grid(alpha=0.3)
    ax2.set_yscale("log")
    ax.set_ylabel("speedup over BF16 LoRA (rollout tokens/s)")
    ax2.set_ylabel("rollout tokens/s")
    if not models:
        ax.set_title(f"ours: {NOT_MEASURED}", fontsize=9, color="tab:red")
    for a in (ax, ax2):
        if a.get_legend_handles_labels()[0]:
            a.legend(fontsize=6, loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=2, frameon=False)
    fig.suptitle(figures.figure_title(artifact, ctx, figures.measured_line(ctx, models or None)), fontsize=10)
    gpu = ctx.measured_gpu(ceiling_model) if ceiling_model else None
    if ceil:
        extra = (f"Ceilings of {ceiling_model}, from the GPU it was measured on ({gpu}): {ceil['source']}; read "
                 f"{ceil['read_gbs']:.0f} GB/s, bf16 {ceil['tflops']:.0f} TFLOP/s; mean context {MEAN_CONTEXT:.0f} "
                 "tokens (prompt 256 + completion 2048 / 2).")
    elif gpu:
        extra = f"No ceilings.json in {ctx.measured_sources()[ceiling_model]} (the folder of {ceiling_model}): " \
                "ceilings not drawn."
    else:
        extra = "No ceilings.json: ceilings not drawn."
    gone = {ctx.measured_model(m): min(oom) for m in models if (oom := baseline_oom(rows, m, "qerl"))}
    if gone:
        extra += " BF16 LoRA out of memory where QeRL runs (no ratio drawn): " + \
            ", ".join(f"{m} from batch {b}" for m, b in gone.items()) + "."
    gpus = ctx.measured_gpus_line("rollout.csv", models=models)
    if gpus:
        extra += f" GPU per model (in each label): {gpus}."
    figures.figure_footer(fig, artifact, ctx, extra)
    fig.subplots_adjust(bottom=0.36, top=0.88, wspace=0.25)
    return fig
