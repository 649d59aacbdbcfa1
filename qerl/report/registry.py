"""The artifact registry: one entry per paper table and figure -- what it needs, how it is drawn, where it goes.

Why: the Snakemake rules (workflow/rules/render.smk: inputs and outputs), the `qerl render` CLI and the tests all read
this one list, so an artifact's inputs, renderer and paper values cannot drift apart. It covers Tables 1-9 and
Figures 1, 3, 4, 5, 7-17 (Figures 2 and 6 are diagrams).

How: `ARTIFACTS["fig8"].needs(cfg)` lists the runs (task role, method, variant, file; expanded over cfg["seeds"]),
the untrained evaluations and the measured profiling files it reads; `input_files` turns that into paths
(qerl/report/context.py states the path grammar and the config keys it reads); `render_artifact` draws it and writes
results/<scale>/tables/<id>.{md,tex,csv,html} or results/<scale>/figures/<id>.{png,pdf}, atomically. Methods the config
does not train are left out of the needs and named in the caption ("Not run in this config").

Which runs stand for which paper artifact (one model per config, so several paper figures share our runs):
- Tables 1 / 2 and Figures 3, 4 (bottom), 5: task role "grpo"; Figures 4 (top), 7, 12, 13, 14: role "dapo".
- Ablations (Figures 8, 9, 10, 15, 16, 17 and Table 9's training rows): the grpo task (train.ablations.task, when
  set), method train.ablations.method (qerl) -- Fig. 16 qerl and Fig. 17 lora, if in train.ablations.lr_methods --,
  variants "noaqn", "aqn-<schedule>", "rank<r>", "lr<value>", on the seeds train.ablations.seeds (Fig. 8's "default"
  run too, so that both of its curves average the same seeds).
- Paper figures drawn from the same runs say so in their captions (Figs. 3 and 5; 7, 12 and 13; 9 and 15).

Run: `python -m qerl.report.registry` lists every artifact and its inputs for config/config.yaml;
`python -m qerl.report.registry --write-captions workflow/report` rewrites the Snakemake report captions.
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from qerl.contract import paths
from qerl.contract.methods import LEARNING_METHODS
from qerl.contract.variants import aqn_variant, rank_variant
from qerl.io import write_text
from qerl.report import accuracy_tables, batch_sweep, beyond, efficiency_tables, figures, tables
from qerl.report.context import (
    Context,
    EvalSpec,
    Needs,
    RunSpec,
    ablation,
    eval_path,
    MEASURED_FILES,
    lr_variant,
    measured_folders,
    run_path,
    run_seeds,
    task_name,
    trained_methods,
    untrained_benchmarks,
    untrained_methods,
)
from qerl.report.figures import Panel

__all__ = ["Artifact", "ARTIFACTS", "TABLE_FORMATS", "get_artifact", "plotted_metrics", "input_files",
           "output_files", "render_artifact"]

# The files of a table: Markdown, LaTeX, CSV to download, and the HTML page the Snakemake report displays.
TABLE_FORMATS = ("md", "tex", "csv", "html")


@dataclass(frozen=True)
class Artifact:
    """One paper table or figure.

    Attributes:
        id: "table1" ... "table9", "fig1" ... "fig17".
        kind: "table" or "figure".
        title: the paper's artifact in a line.
        caption: what it shows and how ours map onto it (also the Snakemake report caption).
        category: Snakemake report category.
        needs: config -> Needs (runs, untrained evaluations, measured files, config).
        renderer: (Context, Artifact) -> tables.Table or a matplotlib Figure.
        same_data: which other artifacts show these same runs (one model per config stands in for the paper's
            several), said in the report caption and in the figure's footer; "" when none does.
    """

    id: str
    kind: str
    title: str
    caption: str
    category: str
    needs: Callable[[dict], Needs]
    renderer: Callable[[Context, "Artifact"], Any]
    same_data: str = ""


# ------------------------------------------------------------------------------------------------ needs helpers
def _runs(cfg: dict, role: str, methods: list[str], variants: list[str] | None = None, file: str = paths.METRICS_FILE,
          labels: dict[str, str] | None = None, seeds: list[int] | None = None) -> tuple[list[RunSpec], list[str]]:
    """Run specs of `methods` x `variants` on the role's task (on `seeds`, default the config's); methods not
    trained (or no task) go to `skipped`, one entry per reason: "mxfp4_lora, qlora (not in train.methods)"."""
    if task_name(cfg, role) is None:
        return [], [f"{', '.join(methods)} (no {role} task in train.tasks)"]
    configured = trained_methods(cfg, role)
    runs, missing = [], {}
    for method in methods:
        if method not in configured:
            where = "train.methods" if method not in trained_methods(cfg) else \
                f"train.tasks.{task_name(cfg, role)}.methods"
            missing.setdefault(f"not in {where}", []).append(method)
            continue
        for variant in variants or ["default"]:
            runs.append(RunSpec(role, method, variant, file, (labels or {}).get(variant, ""),
                                None if seeds is None else tuple(seeds)))
    return runs, [f"{', '.join(ms)} ({reason})" for reason, ms in missing.items()]


def _curves(role_methods: list[tuple[str, list[str]]]) -> Callable[[dict], Needs]:
    def needs(cfg: dict) -> Needs:
        runs, skipped = [], []
        for role, methods in role_methods:
            r, s = _runs(cfg, role, methods)
            runs += r
            skipped += [f"{role.upper()} task: {x}" for x in s] if len(role_methods) > 1 else s
        return Needs(runs=tuple(runs), skipped=tuple(skipped))
    return needs


def _ablation(variants: Callable[[dict], list[str]], method: str | None = None,
              labels: Callable[[dict], dict] | None = None) -> Callable[[dict], Needs]:
    """Needs of an ablation figure: `method` (default train.ablations.method) x variants, on the ablation seeds."""
    def needs(cfg: dict) -> Needs:
        chosen = method or ablation(cfg, "method")
        runs, skipped = _runs(cfg, ablation(cfg, "task"), [chosen], variants(cfg),
                              labels=labels(cfg) if labels else None, seeds=ablation(cfg, "seeds"))
        return Needs(runs=tuple(runs), skipped=tuple(skipped))
    return needs


def _lr_ablation(method: str, method_label: str) -> Callable[[dict], Needs]:
    def needs(cfg: dict) -> Needs:
        if method not in ablation(cfg, "lr_methods"):
            return Needs(skipped=(f"{method} (not in train.ablations.lr_methods)",))
        labels = {lr_variant(lr): f"{method_label}, lr {float(lr):g}" for lr in ablation(cfg, "lrs")}
        return _ablation(lambda c: [lr_variant(lr) for lr in ablation(c, "lrs")], method, lambda c: labels)(cfg)
    return needs


def _fig8_needs(cfg: dict) -> Needs:
    method = ablation(cfg, "method")
    labels = {"default": f"{method} (AQN)", "noaqn": f"{method} without AQN (noaqn)"}
    base = _ablation(lambda c: ["default"], labels=lambda c: labels)(cfg)
    if not ablation(cfg, "noaqn"):
        return Needs(runs=base.runs, skipped=base.skipped + ("noaqn (train.ablations.noaqn is false)",))
    extra = _ablation(lambda c: ["noaqn"], labels=lambda c: labels)(cfg)
    return Needs(runs=base.runs + extra.runs, skipped=base.skipped)


def _accuracy(role: str, methods: list[str]) -> Callable[[dict], Needs]:
    def needs(cfg: dict) -> Needs:
        untrained = [m for m in methods if m in ("bf16", "nf4", "mxfp4", "nvfp4")]
        evaluated = untrained_methods(cfg) if untrained_benchmarks(cfg, role) else []
        evals = tuple(EvalSpec(role, m) for m in untrained if m in evaluated)
        runs, skipped = _runs(cfg, role, [m for m in methods if m not in untrained], file=paths.EVAL_FILE)
        absent = [m for m in untrained if m not in evaluated]
        skipped += [f"{', '.join(absent)} (not evaluated: evaluate.methods / evaluate.benchmarks)"] if absent else []
        return Needs(runs=tuple(runs), evals=evals, skipped=tuple(skipped))
    return needs


def _measured(*names: str) -> Callable[[dict], Needs]:
    return lambda cfg: Needs(measured=names)


def _table9_needs(cfg: dict) -> Needs:
    rank_runs = _ablation(_ranks)(cfg)
    return Needs(runs=rank_runs.runs, measured=("rollout.csv",), skipped=rank_runs.skipped)


def _fig1_needs(cfg: dict) -> Needs:
    runs, skipped = _runs(cfg, "grpo", ["lora", "qlora", "qerl", "full"], file=paths.EVAL_FILE)
    return Needs(runs=tuple(runs), measured=("rollout.csv", "e2e.csv"), skipped=tuple(skipped))


def _schedules(cfg):
    return [aqn_variant(s) for s in ablation(cfg, "aqn_schedules")]


def _ranks(cfg):
    return [rank_variant(r) for r in ablation(cfg, "ranks")]


def _curve_fig(panels: list[Panel], layout: str = "cols"):
    def render(ctx, artifact):
        return figures.render_curves(ctx, artifact, panels, layout)
    render.panels = tuple(panels)  # what plotted_metrics reads
    return render


_QUANT_VS_BF16 = ["lora", "nvfp4_lora", "mxfp4_lora", "qlora"]
_FIG4 = ["nvfp4_lora", "mxfp4_lora", "qlora", "lora", "full"]
_BIGMATH = ["qerl", "lora", "full"]
_REWARD = Panel("reward", "accuracy reward", ylabel="reward")
_ENTROPY = Panel("entropy", "policy entropy", ylabel="entropy")

# ------------------------------------------------------------------------------------------------ the registry
_ENTRIES = [
    Artifact("table1", "table", "Table 1: GSM8K, GRPO (pass@1)",
             "Paper: GSM8K pass@1 of Qwen2.5-3B/7B-Instruct after GRPO, per weight format and training method, and "
             "untrained in each format. Ours: the GRPO task's test benchmark(s), same methods.",
             "Accuracy", _accuracy("grpo", ["bf16", "nf4", "mxfp4", "nvfp4", "full", "lora", "qlora", "mxfp4_lora",
                                             "nvfp4_lora", "qerl"]), accuracy_tables.render_table1),
    Artifact("table2", "table", "Table 2: BigMath, DAPO (MATH500 / AIME24 / AIME25 / AMC23 / average)",
             "Paper: pass@1 of 7B/14B/32B after DAPO on BigMath; every average is the mean of its four cells. Ours: "
             "the DAPO task's benchmark(s); at the tiny scale one generated test set, with per-level columns.",
             "Accuracy", _accuracy("dapo", ["bf16", "nvfp4", "full", "lora", "nvfp4_lora", "qerl"]),
             accuracy_tables.render_table2),
    Artifact("table3", "table", "Table 3: model size and E2E GRPO step speedup vs BF16 LoRA",
             "Paper: 1 x H100-80GB, prompt 256, completion <= 2048, average of the first 30 steps, batch 2/4/8.",
             "Efficiency", _measured("e2e.csv", "memory.csv"), efficiency_tables.render_table3),
    Artifact("table4", "table", "Table 4: RL hyperparameters",
             "Paper: GRPO (GSM8K) and DAPO (BigMath) settings; no entropy or KL loss.",
             "Setup", lambda cfg: Needs(config=True), accuracy_tables.render_table4),
    *[Artifact(f"table{n}", "table", f"Table {n}: rollout throughput and E2E speedup, {model}",
               f"Paper: {model}, vLLM rollout tokens/s and speedup over BF16 LoRA, E2E step speedup without / with "
               "gradient checkpointing (GC), batch 2 and 8.",
               "Efficiency", _measured("rollout.csv", "e2e.csv", "memory.csv"), efficiency_tables.render_table5_8)
      for n, model in ((5, "3B"), (6, "7B"), (7, "14B"), (8, "32B"))],
    Artifact("table9", "table", "Table 9: rollout tokens/s by LoRA rank (batch 1)",
             "Paper: vLLM rollout throughput of BF16 LoRA, NVFP4 (QeRL) and QLoRA at LoRA rank 16/32/64.",
             "Efficiency", _table9_needs, efficiency_tables.render_table9),
    Artifact("fig1", "figure", "Figure 1: speed and accuracy of LoRA, QLoRA, QeRL and full fine-tuning",
             "Paper: 7B rollout and E2E speed at batch 8 and GSM8K accuracy. Ours: measured speed (when committed) "
             "and the GRPO task's accuracy.", "Efficiency", _fig1_needs, figures.render_fig1),
    Artifact("fig3", "figure", "Figure 3: quantization raises policy entropy",
             "Entropy and reward of 4-bit LoRA (NVFP4, MXFP4, NF4) vs BF16 LoRA, GRPO task.",
             "Training dynamics", _curves([("grpo", _QUANT_VS_BF16)]), _curve_fig([_ENTROPY, _REWARD]),
             "Same data: the entropy panel is Fig. 5; the reward panel is Fig. 4's GRPO panel without BF16 full."),
    Artifact("fig4", "figure", "Figure 4: accuracy reward, DAPO (top) and GRPO (bottom)",
             "NVFP4 / MXFP4 / NF4 LoRA vs BF16 LoRA vs BF16 full fine-tuning on both tasks.",
             "Training dynamics", _curves([("dapo", _FIG4), ("grpo", _FIG4)]),
             _curve_fig([Panel("reward", "DAPO task", role="dapo", ylabel="reward"),
                         Panel("reward", "GRPO task", role="grpo", ylabel="reward")], layout="rows"),
             "Same data: the GRPO panel is Fig. 3's reward panel plus BF16 full fine-tuning."),
    Artifact("fig5", "figure", "Figure 5: policy entropy, GRPO",
             "Paper: 7B, rank 32, GSM8K, steps 0-200. Ours: the GRPO task.",
             "Training dynamics", _curves([("grpo", _QUANT_VS_BF16)]), _curve_fig([_ENTROPY]),
             "Same data: Fig. 3's entropy panel."),
    Artifact("fig7", "figure", "Figure 7: BigMath reward, QeRL vs LoRA vs full",
             "Paper: 7B and 14B, levels 3-5, DAPO. Ours: the DAPO task.",
             "Training dynamics", _curves([("dapo", _BIGMATH)]), _curve_fig([_REWARD]),
             "Same data: Figs. 12 and 13 are this plot (one model per config stands in for each paper size)."),
    Artifact("fig8", "figure", "Figure 8: AQN ablation (with vs without AQN)",
             "Paper: 3B (80 steps) and 7B (250 steps). Ours: QeRL default vs its 'noaqn' variant on the ablation task, "
             "both on the ablation seeds (train.ablations.seeds).",
             "Ablations", _fig8_needs, _curve_fig([_REWARD])),
    Artifact("fig9", "figure", "Figure 9: AQN noise schedulers",
             "Paper: linear, exponential, cosine, logarithmic decay over 10 stages, 3B, 150 steps. Ours: the "
             "'aqn-<schedule>' variants of QeRL: reward and the sigma each run used.",
             "Ablations", _ablation(_schedules),
             _curve_fig([_REWARD, Panel("sigma", "AQN sigma", smooth=False, ylabel="sigma")]),
             "Same data: the sigma panel is Fig. 15's left panel."),
    Artifact("fig10", "figure", "Figure 10: LoRA rank ablation",
             "Paper: QeRL reward at rank 16/32/64/128, 3B, 150 steps. Ours: the 'rank<r>' variants of QeRL.",
             "Ablations", _ablation(_ranks), _curve_fig([_REWARD])),
    Artifact("fig11", "figure", "Figure 11: rollout tokens/s by LoRA rank",
             "Paper bars: Table 9. Ours: results/measured/<gpu>/rollout.csv at batch 1 (hatched), when committed.",
             "Efficiency", _measured("rollout.csv"), figures.render_fig11),
    Artifact("figbatch", "figure", "Rollout speedup over BF16 LoRA across batch sizes (not a paper figure)",
             "The paper's speed claim (> 1.5x, measured there at batch 1-8) across rollout batches 1-256: QeRL and "
             "QLoRA tokens/s over BF16 LoRA's at each batch (rank 32, results/measured/<gpu>/rollout.csv), beside "
             "the NVFP4-vs-BF16 ceiling from the measured read bandwidth and matrix rate "
             "(results/measured/<gpu>/ceilings.json); right: tokens/s and each method's roofline. The verdict per "
             "batch regime is in claims.md (claim 1).",
             "Efficiency", _measured("rollout.csv", "ceilings.json"), batch_sweep.render_figbatch),
    Artifact("tableaqn", "table", "AQN on BF16 and NVFP4, and truncated importance sampling (not a paper table)",
             "Is it the noise or the quantization? The 2 x 2 design the paper does not run (BF16 / NVFP4 weights x "
             "without / with AQN: BF16 LoRA, BF16 LoRA + AQN, NVFP4 LoRA, QeRL) on the GRPO task's main seeds, with "
             "QeRL corrected by truncated importance sampling (variant tis<C>) and QeRL with trainable RMSNorm "
             "weights (variant norms, ablation seeds).",
             "Beyond the paper", beyond.tableaqn_needs, beyond.render_tableaqn),
    Artifact("figmismatch", "figure", "Rollout-train mismatch over steps (not a paper figure)",
             "How far the policy that sampled the rollouts is from the clean policy the update trains: the per-token "
             "k3 KL between the sampler's and the teacher-forced log-probs of the sampled tokens, per step, for BF16 "
             "LoRA (+ AQN), NVFP4 LoRA and QeRL (+ TIS). Log scale: without AQN it is float rounding alone.",
             "Beyond the paper", beyond.figmismatch_needs,
             _curve_fig([Panel("mismatch_kl", "rollout-train mismatch (k3 KL per token)", smooth=False,
                               ylabel="mismatch KL", log=True),
                         Panel("is_ratio_p99", "pi_old / pi_sampler, 99th percentile", smooth=False,
                               ylabel="IS ratio p99")])),
    Artifact("fig12", "figure", "Figure 12: BigMath reward, 7B / 14B (appendix H)",
             "Paper: QeRL vs LoRA vs full, levels 3-5, 250 steps. Ours: the DAPO task.",
             "Training dynamics", _curves([("dapo", _BIGMATH)]), _curve_fig([_REWARD]),
             "Same data: this is Fig. 7's plot (and Fig. 13's): one model per config stands in for each paper size."),
    Artifact("fig13", "figure", "Figure 13: BigMath reward, 32B (appendix H)",
             "Paper: QeRL vs LoRA vs full, levels 4-5, 500 steps. Ours: the DAPO task.",
             "Training dynamics", _curves([("dapo", _BIGMATH)]), _curve_fig([_REWARD]),
             "Same data: this is Fig. 7's plot (and Fig. 12's): one model per config stands in for each paper size."),
    Artifact("fig14", "figure", "Figure 14: policy entropy, BigMath (appendix)",
             "Paper: 14B, 600 steps. Ours: the DAPO task's NVFP4 LoRA (with and without AQN) vs BF16 LoRA.",
             "Training dynamics", _curves([("dapo", list(LEARNING_METHODS))]), _curve_fig([_ENTROPY])),
    Artifact("fig15", "figure", "Figure 15: AQN noise schedules",
             "Left: the sigma our 'aqn-<schedule>' runs used per step. Right: the paper's schedules (Eq. 8 and the "
             "alternatives, Table 4's range, K = 10) over the same number of steps.",
             "Ablations", _ablation(_schedules),
             _curve_fig([Panel("sigma", "ours: sigma per step", smooth=False, ylabel="sigma"),
                         Panel("sigma", "paper: schedules (Eq. 8), Table 4 range, K = 10", ylabel="sigma",
                               draw=figures.draw_paper_schedules)]),
             "Same data: the left panel is Fig. 9's sigma panel."),
    Artifact("fig16", "figure", "Figure 16: QeRL learning rate",
             "Paper: lr 5e-6 vs 3e-5, 7B, 200 steps: QeRL stays stable at 3e-5 and rises ~2x faster. Ours: the "
             "'lr<value>' variants of QeRL.", "Ablations", _lr_ablation("qerl", "QeRL"),
             _curve_fig([_REWARD])),
    Artifact("fig17", "figure", "Figure 17: BF16 LoRA learning rate",
             "Paper: lr 5e-6 vs 3e-5, 7B, 200 steps: BF16 LoRA collapses at 3e-5. Ours: the 'lr<value>' variants of "
             "BF16 LoRA.", "Ablations", _lr_ablation("lora", "BF16 LoRA"), _curve_fig([_REWARD])),
]
ARTIFACTS: dict[str, Artifact] = {a.id: a for a in _ENTRIES}


def get_artifact(artifact_id: str) -> Artifact:
    """The registry entry `artifact_id`. Raises ValueError naming the known ids."""
    try:
        return ARTIFACTS[artifact_id]
    except KeyError:
        raise ValueError(f"unknown artifact {artifact_id!r}; known: {', '.join(ARTIFACTS)}") from None


def plotted_metrics(artifact: Artifact) -> tuple[str, ...]:
    """The metrics.jsonl fields a curve figure plots, one per panel ("reward", "entropy", ...); () for the others."""
    return tuple(p.metric for p in getattr(artifact.renderer, "panels", ()))


def input_files(artifact: Artifact, cfg: dict) -> list[str]:
    """Every file the artifact reads for this config (runs and evaluations over all seeds; measured files present).

    Measured files are committed, so only those that exist are inputs; their absence renders as "not measured".
    An artifact that reads any measured file lists, of every candidate folder (qerl.report.context.measured_folders),
    the files it names, the three profiling CSVs (which folder a model's numbers come from depends on all three)
    and provenance.json: every folder, not only those that supply a model now, so that a folder that starts to
    supply one (a model added to its CSVs) reruns the render too.
    """
    needs = artifact.needs(cfg)
    files = [str(run_path(cfg, spec, seed)) for spec in needs.runs for seed in run_seeds(cfg, spec)]
    for spec in needs.evals:
        files += [str(eval_path(cfg, spec.method, b, seed)) for b in untrained_benchmarks(cfg, spec.role)
                  for seed in cfg["seeds"]]
    if needs.measured:
        names = list(dict.fromkeys((*needs.measured, *MEASURED_FILES, "provenance.json")))
        files += [str(folder / n) for folder in measured_folders(cfg) for n in names if (folder / n).exists()]
    return list(dict.fromkeys(files))


def output_files(artifact: Artifact, cfg: dict, out_dir: str | Path | None = None) -> list[str]:
    """results/<scale>/tables/<id>.{md,tex,csv,html} or results/<scale>/figures/<id>.{png,pdf} (or under
    `out_dir`); the HTML page is the table as the Snakemake report shows it."""
    exts = TABLE_FORMATS if artifact.kind == "table" else ("png", "pdf")
    if out_dir is None:
        return [str(Path(paths.artifact_file(paths.root_of(cfg), artifact.kind, artifact.id, ext))) for ext in exts]
    return [str(Path(out_dir) / f"{artifact.id}.{ext}") for ext in exts]


def render_artifact(artifact_id: str, cfg: dict, out_dir: str | Path | None = None,
                    allow_missing: bool = False) -> list[Path]:
    """Render one artifact and write its files atomically.

    Args:
        artifact_id: a key of ARTIFACTS.
        cfg: the validated config (qerl.config.load_config).
        out_dir: where to write (default results/<scale>/tables or .../figures).
        allow_missing: skip missing run/eval files (noted in the caption) instead of failing.

    Returns:
        The written paths.

    Raises:
        ValueError: unknown id, a missing input (unless allowed) or a malformed input (naming file and line/key).
    """
    artifact = get_artifact(artifact_id)
    ctx = Context(cfg, artifact.needs(cfg), allow_missing=allow_missing)
    target = Path(output_files(artifact, cfg, out_dir)[0]).parent
    result = artifact.renderer(ctx, artifact)
    if artifact.kind == "table":
        return tables.write_table(result, target)
    return figures.write_figure(result, target, artifact.id, artifact.title, ctx.prov.line())


def caption_rst(artifact: Artifact) -> str:
    """The Snakemake report caption of an artifact (workflow/report/<id>.rst)."""
    same = f" {artifact.same_data}" if artifact.same_data else ""
    files = (" The HTML file is the table, shown in this report; the Markdown, LaTeX and CSV files are the same "
             "table to download." if artifact.kind == "table" else "")
    return (f"{artifact.title}\n\n{artifact.caption}{same}\n\n"
            f"Ours beside the paper's numbers; see the header line of the file for scale, model, seeds, commit and "
            f"hardware.{files} Generated by ``python -m qerl.report.registry --write-captions workflow/report``.\n")


def _main(argv: list[str] | None = None) -> int:  # pragma: no cover - a developer helper
    parser = argparse.ArgumentParser(description="list artifacts and their inputs, or write report captions")
    parser.add_argument("--config", default="config/config.yaml")
    parser.add_argument("--write-captions", metavar="DIR")
    args = parser.parse_args(argv)
    if args.write_captions:
        for a in ARTIFACTS.values():
            write_text(Path(args.write_captions) / f"{a.id}.rst", caption_rst(a))
        return 0
    from qerl.config import load_config

    cfg = load_config(args.config, check_data=False)
    for a in ARTIFACTS.values():
        print(f"{a.id}: {a.title}")
        for f in input_files(a, cfg):
            print(f"    {f}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(_main())
