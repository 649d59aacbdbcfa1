"""The accuracy tables: Tables 1 and 2 (pass@1 after RL, per weight format and training method) and Table 4 (the
settings those runs were trained with).

How ours map onto the paper's rows (rows are keyed by model and method):
- Tables 1 and 2: our model's rows carry the paper's W# / training labels. When our model is one of the paper's
  sizes ("Qwen2.5-7B-Instruct" -> 7B) our values sit in the paper's rows of that size; otherwise (tiny, small) they
  form their own block of rows, model = the config's model name, after the paper's rows, with the paper's columns
  empty. Our columns: pass@1 (mean +/- std over seeds) on each benchmark of the task's role
  (qerl.report.context.role_benchmarks), their average when there are several, and the per-level pass@1 when
  there is a single benchmark graded by level (the tiny scale: levels stand in for the paper's easier and harder
  benchmarks). Methods the config does not run read "not run".
- Table 4: the config actually used (the validated train section).

Number formats and the files written: qerl/report/tables.py. Run: `qerl render --config config/config.yaml
--artifact table1`.
"""
from __future__ import annotations

from typing import Any

from qerl.contract import paths
from qerl.contract.records import BenchmarkRecord
from qerl.report import paper
from qerl.report.context import Context, EvalSpec, RunSpec, role_benchmarks, untrained_benchmarks
from qerl.report.inputs import paper_model_label, summarize
from qerl.report.tables import Column, Table, merge_rows, over_seeds

__all__ = ["NOT_RUN", "render_table1", "render_table2", "render_table4", "config_value"]

NOT_RUN = "not run"
NOT_CONFIGURED = "n/a (not configured)"


def _load_eval(ctx: Context, role: str, method: str, benches: list[str]) -> list[dict[str, BenchmarkRecord]] | None:
    """Per-seed results of `method` on the role's benchmarks; None when the config does not run it."""
    if EvalSpec(role, method) in ctx.needs.evals:
        return ctx.untrained_evals(method, untrained_benchmarks(ctx.cfg, role))
    spec = RunSpec(role, method, "default", paths.EVAL_FILE)
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
    rows = merge_rows(rows, ours, ("model", "method"))
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
