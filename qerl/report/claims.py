"""The paper's five headline claims (REPORTED.md, "Headline claims"), each checked against one scale's own results.

Why: the tables and figures put our numbers beside the paper's artifact by artifact; a reader also wants the answer
claim by claim -- what this scale reproduces, contradicts, or cannot test -- with the numbers it rests on, generated
from the same files (never typed by hand), so it is regenerated with every run of the DAG.

How: accuracy comes from the Table 1 / Table 2 renderers (mean and sample std over seeds); entropy and reward curves
from the runs of Figures 3/4/14 (metrics.jsonl); the schedule ablation from Figure 9's runs; speed and memory from the
committed measurements (results/measured/<gpu>/) through the Table 3 / 5-8 renderers. A comparison of two means
a - b reads "holds" when a - b > 2 SE (SE = sqrt(std_a^2/n_a + std_b^2/n_b), the seeds' spread), "contradicted"
when a - b < -2 SE, and "within noise" otherwise; with one seed there is no spread and the sign alone is reported.

Run: `qerl claims --config results/tiny/config.yaml --out results/tiny/claims.md --html results/tiny/claims.html`
(the DAG's `claims` rule; the HTML page is the same text, as the Snakemake report displays it); docs/CLAIMS_TINY.md
is a committed copy of the tiny scale's output.
"""
from __future__ import annotations

import datetime
import math

from qerl.contract.methods import METHODS, get_method
from qerl.io import write_text
from qerl.report import batch_sweep, paper, tables
from qerl.report.context import (Context, Needs, RunSpec, ablation, role_benchmarks, run_path, task_name,
                                 trained_methods)
from qerl.report.inputs import Stat, paper_model_label, summarize
from qerl.report.registry import ARTIFACTS, input_files

__all__ = ["ARTIFACTS_READ", "claims_inputs", "compare", "render_claims", "markdown_to_html", "add_arguments", "run"]

# The registry entries whose inputs the claims read (the DAG rule's inputs are theirs).
ARTIFACTS_READ = ("table1", "table2", "table3", "table5", "table6", "table7", "table8", "tableaqn", "fig3", "fig4",
                  "fig8", "fig9", "fig14")
_FOUR_BIT = ("nvfp4_lora", "mxfp4_lora", "qlora", "qerl")


_TIMED = ("lora", "qlora", "nvfp4_lora", "qerl")  # the GRPO runs whose step phases the claims print (_cpu_timing)


def _short(method: str) -> str:
    """A method's short label (efficiency tables), or the name as measured when the registry does not know it."""
    return METHODS[method].short if method in METHODS else method


def claims_inputs(cfg: dict) -> list[str]:
    """Every run, evaluation and measured file the claims read for this config."""
    files = [f for a in ARTIFACTS_READ for f in input_files(ARTIFACTS[a], cfg)]
    if task_name(cfg, "grpo") is not None:
        files += [str(run_path(cfg, RunSpec("grpo", m), seed)) for m in _TIMED if m in trained_methods(cfg, "grpo")
                  for seed in cfg["seeds"]]
    return list(dict.fromkeys(files))


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


def _context(cfg: dict, needs: Needs, seen: list[Context]) -> Context:
    """A Context whose provenance (commits, hardware of the files read) ends up in the document's header."""
    ctx = Context(cfg, needs)
    seen.append(ctx)
    return ctx


def _fmt(x: Stat | float | None, digits: int = 3) -> str:
    if isinstance(x, Stat):
        return tables.format_value(x, digits)
    return "n/a" if x is None or not math.isfinite(x) else f"{x:.{digits}f}"


def _diff_text(a: Stat, b: Stat, digits: int, tally: list[str] | None = None) -> str:
    """"+1.2 ± 0.3 SE: **holds**"; the verdict's first word is appended to `tally` when given."""
    diff, se, verdict = compare(a, b)
    if tally is not None:
        tally.append(verdict.split(" (")[0])
    spread = f" ± {se:.{digits}f} SE" if se is not None else ""
    return f"{diff:+.{digits}f}{spread}: **{verdict}**"


def _count(tally: list[str]) -> str:
    """"2 hold, 1 within noise" from a list of verdicts."""
    names = {"holds": "hold", "does not hold": "do not hold"}
    order = ("holds", "within noise", "contradicted", "does not hold")
    return ", ".join(f"{tally.count(v)} {names.get(v, v)}" for v in order if v in tally) or "nothing to compare"


# --------------------------------------------------------------------------------------------- claim 1, 2: speed
def _num(x) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else None


def _cell(x) -> str:
    return f"{x:.2f}" if _num(x) is not None else str(x)


def _speed(cfg: dict, seen: list[Context]) -> tuple[list[str], str] | None:
    """Claim 1 from the committed rollout.csv / e2e.csv (the Table 5-8 arithmetic); None when neither exists."""
    ctx = _context(cfg, Needs(measured=("rollout.csv", "e2e.csv")), seen)
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
                         and r["method"] in tables.method_aliases(method)]
                return min(cands, key=lambda r: r["rank"])["tokens_per_s"] if cands else None
            q, ref = tps("qerl"), tps("lora")
            roll = q / ref if q and ref else tables.NOT_MEASURED
            e_no, e_gc = (tables.e2e_speedup(e2e, model, "qerl", batch, gc) for gc in (False, True))
            ql_no, ql_gc = (tables.e2e_speedup(e2e, model, "qlora", batch, gc) for gc in (False, True))
            rx += [roll] if _num(roll) is not None else []
            ex += [v for v in (e_no, e_gc) if _num(v) is not None]
            qx += [v for v in (ql_no, ql_gc) if _num(v) is not None]
            rows.append(f"| {paper_model_label(model)} | {batch} | {_cell(roll)} | {_cell(e_no)} | {_cell(e_gc)} | "
                        f"{_cell(ql_no)} | {_cell(ql_gc)} |")

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
    lines = [f"Measured ({where}); speedup = BF16 LoRA time / method time at the same batch, rollout at the lowest "
             "LoRA rank measured; E2E without and with gradient checkpointing (GC); \"OOM\" or \"s/step\" where "
             "BF16 LoRA has no step to compare with.", "",
             "| model | batch | QeRL rollout x | QeRL E2E x | QeRL E2E x (GC) | QLoRA E2E x | QLoRA E2E x (GC) |",
             "|---|---|---|---|---|---|---|", *rows, "", f"- {summary}.", ""]
    return lines, summary + "."


def _memory_32b(cfg: dict, seen: list[Context]) -> tuple[list[str], str] | None:
    """Claim 2 from the committed memory.csv and e2e.csv rows of the 32B model; None when there are none."""
    ctx = _context(cfg, Needs(measured=("e2e.csv", "memory.csv")), seen)
    memory = [r for r in ctx.measured("memory.csv") or [] if paper_model_label(r["model"]) == "32B"]
    e2e = [r for r in ctx.measured("e2e.csv") or [] if paper_model_label(r["model"]) == "32B"]
    if not memory and not e2e:
        return None
    lines = [f"- {_short(r['method'])}: weights {r['model_size_gb']:.1f} GB, peak "
             f"{_cell(r['peak_gb'])} GB (memory.csv)" for r in memory]
    lines += [f"- {_short(r['method'])} GRPO step, batch {r['batch']}"
              f"{' with GC' if r['gc'] else ''}: {_cell(r['step_s'])}{'' if r['step_s'] == 'OOM' else ' s'}"
              for r in e2e]
    qerl_peak = [_num(r["peak_gb"]) for r in memory if r["method"] in tables.method_aliases("qerl")]
    qerl_steps = [r for r in e2e if r["method"] in tables.method_aliases("qerl") and _num(r["step_s"]) is not None]
    lora_peak = [_cell(r["peak_gb"]) for r in memory if r["method"] == "lora"]
    others = f"; BF16 LoRA's peak: {lora_peak[0]} GB" if lora_peak else ""
    if qerl_steps and qerl_peak and all(p is not None and p <= 80 for p in qerl_peak):
        verdict = (f"**holds**: QeRL 32B completes GRPO steps and its measured peak is {max(qerl_peak):.1f} GB "
                   f"(<= 80 GB){others}")
    elif qerl_steps or qerl_peak:
        verdict = "**not shown**: no QeRL 32B step with a measured peak <= 80 GB"
    else:
        verdict = "**not measured** for QeRL"
    where = "; ".join(ctx.prov.sources)
    return [f"Measured ({where}):", "", *lines, "", f"- {verdict}.", ""], verdict + "."


def _cpu_timing(cfg: dict, seen: list[Context]) -> list[str]:
    """Per-step rollout and update seconds of the GRPO runs (this scale's own hardware)."""
    ctx = _context(cfg, Needs(), seen)
    lines = []
    for method in _TIMED:
        if method not in trained_methods(cfg, "grpo") or task_name(cfg, "grpo") is None:
            continue
        per_seed = ctx.metrics(RunSpec("grpo", method))
        roll = summarize([sum(m["time_rollout"]) / len(m["time_rollout"]) for m in per_seed])
        upd = summarize([sum(m["time_update"]) / len(m["time_update"]) for m in per_seed])
        lines.append(f"| {get_method(method).prose} | {_fmt(roll)} | {_fmt(upd)} |")
    if not lines:
        return []
    return ["| method | rollout s/step | update s/step |", "|---|---|---|", *lines]


# --------------------------------------------------------------------------------------------- claim 3: entropy
def _curve_stats(per_seed: list[dict[str, list[float]]]) -> dict[str, Stat]:
    def quarter(xs: list[float], last: bool) -> float:
        k = max(1, len(xs) // 4)
        part = xs[-k:] if last else xs[:k]
        return sum(part) / len(part)

    return {
        "entropy0": summarize([m["entropy"][0] for m in per_seed]),
        "entropy": summarize([sum(m["entropy"]) / len(m["entropy"]) for m in per_seed]),
        "reward_first": summarize([quarter(m["reward"], False) for m in per_seed]),
        "reward_last": summarize([quarter(m["reward"], True) for m in per_seed]),
        "growth": summarize([quarter(m["reward"], True) - quarter(m["reward"], False) for m in per_seed]),
    }


def _claim3(cfg: dict, seen: list[Context]) -> tuple[list[str], str]:
    out, summary = [], []
    for role, title in (("grpo", "GRPO task (Figs. 3, 4 bottom, 5)"), ("dapo", "DAPO task (Figs. 4 top, 14)")):
        methods = [m for m in ("lora", *_FOUR_BIT) if m in trained_methods(cfg, role)]
        if task_name(cfg, role) is None or "lora" not in methods or len(methods) < 2:
            out += [f"*{title}*: not run in this config (needs BF16 LoRA and a 4-bit LoRA method).", ""]
            summary.append(f"{role.upper()}: not run")
            continue
        ctx = _context(cfg, Needs(), seen)
        stats = {m: _curve_stats(ctx.metrics(RunSpec(role, m))) for m in methods}
        n_steps = len(ctx.metrics(RunSpec(role, "lora"))[0]["reward"])
        out += [f"*{title}*, task `{task_name(cfg, role)}`, {n_steps} steps, mean ± std over seeds; reward growth = "
                "mean reward of the last quarter of the steps minus that of the first quarter.", "",
                "| method | entropy, step 0 | entropy, mean over steps | reward, first quarter | reward, last quarter "
                "| reward growth |", "|---|---|---|---|---|---|"]
        out += [f"| {get_method(m).prose} | {_fmt(s['entropy0'])} | {_fmt(s['entropy'])} | {_fmt(s['reward_first'])} | "
                f"{_fmt(s['reward_last'])} | {_fmt(s['growth'])} |" for m, s in stats.items()]
        out.append("")
        entropy0, entropy, growth = [], [], []
        for m in methods[1:]:
            a, b = stats[m], stats["lora"]
            out.append(f"- {get_method(m).prose} - BF16 LoRA: entropy at step 0 "
                       f"{_diff_text(a['entropy0'], b['entropy0'], 3, entropy0)}; "
                       f"mean entropy {_diff_text(a['entropy'], b['entropy'], 3, entropy)}; "
                       f"reward growth {_diff_text(a['growth'], b['growth'], 3, growth)}.")
        out.append("")
        summary.append(f"{role.upper()}, {len(methods) - 1} methods: higher mean entropy "
                       f"{_count(entropy)}; higher entropy at step 0 {_count(entropy0)}; faster reward growth "
                       f"{_count(growth)}")
    return out, "; ".join(summary) + "."


# --------------------------------------------------------------------------------------------- claim 4: accuracy
def _accuracy(cfg: dict, table_id: str, role: str, seen: list[Context]) -> tuple[dict[str, Stat], str] | None:
    """{method: pass@1 Stat} of our rows of Table 1/2, and the column they come from; None if the role is not run."""
    if task_name(cfg, role) is None:
        return None
    artifact = ARTIFACTS[table_id]
    table = artifact.renderer(_context(cfg, artifact.needs(cfg), seen), artifact)
    benches = role_benchmarks(cfg, role)
    prefix = f"ours ({cfg['scale']})"
    column = f"{prefix}: {benches[0]}" if len(benches) == 1 else f"{prefix}: avg"
    label = paper_model_label(cfg["model"]["name"])
    out = {}
    for row in table.rows:
        if row.get("model") == label and isinstance(row.get(column), Stat) and row[column].n > 0:
            out.setdefault(row["method"], row[column])
    return out, column


def _claim4(cfg: dict, seen: list[Context]) -> tuple[list[str], str]:
    out, summary = [], []
    for table_id, role in (("table1", "grpo"), ("table2", "dapo")):
        found = _accuracy(cfg, table_id, role, seen)
        title = f"{table_id.replace('table', 'Table ')} ({role.upper()} task)"
        if found is None or not {"qerl", "lora"} <= set(found[0]):
            out += [f"*{title}*: not run in this config.", ""]
            summary.append(f"{title}: not run")
            continue
        acc, column = found
        out += [f"*{title}*, column `{column}` (pass@1 %, mean ± std over seeds):", "",
                "| method | trained | untrained, same format | trained - untrained (verdict: RL raised pass@1) |",
                "|---|---|---|---|"]
        for m in ("full", "lora", "qlora", "mxfp4_lora", "nvfp4_lora", "qerl"):
            if m in acc:
                base = acc.get(get_method(m).weights)
                gain = _diff_text(acc[m], base, 1) if base is not None else "n/a"
                out.append(f"| {get_method(m).prose} | {_fmt(acc[m], 1)} | {_fmt(base, 1)} | {gain} |")
        out.append("")
        vs_lora = _diff_text(acc["qerl"], acc["lora"], 1)
        out.append(f"- QeRL - BF16 LoRA: {vs_lora} (claim: QeRL >= LoRA).")
        line = f"{title}: QeRL - BF16 LoRA {vs_lora}"
        if "nvfp4_lora" in acc:
            out.append(f"- AQN: QeRL - NVFP4 LoRA without AQN: {_diff_text(acc['qerl'], acc['nvfp4_lora'], 1)}.")
        if "full" in acc:
            vs_full = _diff_text(acc["qerl"], acc["full"], 1)
            out.append(f"- QeRL - BF16 full: {vs_full} (claim: close to full).")
            line += f"; QeRL - BF16 full {vs_full}"
        out.append("")
        summary.append(line)
    return out, "; ".join(summary) + "."


# --------------------------------------------------------------------------------------------- RL learns here
_LEARN_SE = {"grpo": 3, "dapo": 2}  # how many standard errors a gain must clear (the tiny scale's targets)


def _above(diff: float, se: float | None, k: int) -> str:
    if se is None:
        return "one seed" if diff == diff else "n/a"
    return f"**yes** (> {k} SE)" if diff > k * se else f"no (<= {k} SE)"


def _learning(cfg: dict, seen: list[Context]) -> tuple[list[str], str]:
    """Does RL move reward and held-out pass@1 at this scale? The precondition of claims 3-5."""
    out, summary = [], []
    for table_id, role in (("table1", "grpo"), ("table2", "dapo")):
        k, title = _LEARN_SE[role], f"{role.upper()} task"
        found = _accuracy(cfg, table_id, role, seen)
        if found is None:
            out += [f"*{title}*: not run in this config.", ""]
            continue
        acc, column = found
        ctx = _context(cfg, Needs(), seen)
        methods = [m for m in trained_methods(cfg, role) if m in acc]
        out += [f"*{title}* (`{task_name(cfg, role)}`): reward growth = mean reward of the last quarter of the steps "
                f"minus the first quarter, per seed; held-out gain = pass@1 (`{column}`) after training minus the "
                f"untrained model of the same weight format; mean ± std over seeds, SE from that spread; a change "
                f"counts when it is above {k} SE.", "",
                "| method | reward, first quarter | reward, last quarter | reward growth | above noise | held-out "
                "trained | untrained | held-out gain | above noise |", "|---|---|---|---|---|---|---|---|---|"]
        grew = gained = 0
        for m in methods:
            c = _curve_stats(ctx.metrics(RunSpec(role, m)))
            g = c["growth"]
            g_se = g.std / math.sqrt(g.n) if g.std is not None and g.n > 1 else None
            base = acc.get(get_method(m).weights)
            diff, se, _ = compare(acc[m], base) if base is not None else (float("nan"), None, "")
            v_growth, v_gain = _above(g.mean, g_se, k), _above(diff, se, k)
            grew += v_growth.startswith("**yes")
            gained += v_gain.startswith("**yes")
            gain = f"{diff:+.1f}" + (f" ± {se:.1f} SE" if se is not None else "") if base is not None else "n/a"
            out.append(f"| {get_method(m).prose} | {_fmt(c['reward_first'])} | {_fmt(c['reward_last'])} | {g.mean:+.3f}"
                       f"{f' ± {g_se:.3f} SE' if g_se is not None else ''} | {v_growth} | {_fmt(acc[m], 1)} | "
                       f"{_fmt(base, 1)} | {gain} | {v_gain} |")
        out.append("")
        summary.append(f"{title}: reward growth above {k} SE for {grew} of {len(methods)} methods, held-out gain "
                       f"above {k} SE for {gained} of {len(methods)}")
    return out, ("; ".join(summary) + ".") if summary else "not run."


# --------------------------------------------------------------------------------------------- claim 5: schedules
def _claim5(cfg: dict, seen: list[Context]) -> tuple[list[str], str]:
    needs = ARTIFACTS["fig9"].needs(cfg)
    if not needs.runs:
        return ["Not run in this config (train.ablations.aqn_schedules).", ""], "not run."
    ctx = _context(cfg, needs, seen)
    rows, late_std = [], {}
    for spec in needs.runs:
        per_seed = ctx.metrics(spec)
        half = [m["reward"][len(m["reward"]) // 2:] for m in per_seed]
        std = summarize([_std(h) for h in half])
        mean = summarize([sum(h) / len(h) for h in half])
        name = spec.variant.removeprefix("aqn-")
        late_std[name] = std.mean
        rows.append(f"| {name} | {_fmt(mean)} | {_fmt(std)} | {len(per_seed)} |")
    best = min(late_std, key=late_std.get)
    seeds = ablation(cfg, "seeds")
    verdict = ("holds" if best == "exponential" else f"not reproduced: the lowest late-step spread is {best}'s")
    note = " (one seed: a single draw per schedule)" if len(seeds) < 2 else ""
    return [f"QeRL with each AQN schedule, train.ablations.seeds {list(seeds)}; the reward of the second half of the "
            "steps: its mean, and its step-to-step std (lower = more stable).", "",
            "| schedule | late reward, mean | late reward, std over steps | seeds |", "|---|---|---|---|", *rows, "",
            f"- Most stable late (lowest std): {best}: **{verdict}**{note}.", ""], f"**{verdict}**{note}."


# --------------------------------------------------------------------------------------------- beyond the paper
def _beyond(cfg: dict, seen: list[Context]) -> tuple[list[str], str]:
    """Noise alone, quantization alone, and what TIS changed, from the AQN table's runs (qerl/report/beyond.py)."""
    from qerl.report import beyond

    variants = beyond.aqn_variants(cfg)
    rows = {(m, v): label for m, v, label, _ in variants}
    schedule = cfg["train"]["aqn"]["schedule"]
    bf16, bf16_aqn = ("lora", "default"), ("lora", f"aqn-{schedule}")
    nvfp4, qerl = ("nvfp4_lora", "default"), ("qerl", "default")
    if not {bf16, nvfp4, qerl} <= set(rows):
        return ["Not run in this config (needs BF16 LoRA, NVFP4 LoRA and QeRL on the GRPO task).", ""], "not run."
    artifact = ARTIFACTS["tableaqn"]
    ctx = _context(cfg, artifact.needs(cfg), seen)
    bench = role_benchmarks(cfg, "grpo")[0]
    stats = {(m, v): beyond.row_stats(ctx, RunSpec("grpo", m, v, "metrics.jsonl", label, seeds), bench)
             for m, v, label, seeds in variants}
    out, summary = ["The AQN table (tableaqn) and figure figmismatch; differences of means over seeds, verdicts as "
                    "above (higher entropy, faster reward growth, higher held-out pass@1). Entropy at step 0 cannot "
                    "differ with AQN alone: the schedule's first stage adds no noise (Alg. 1). Each run trains at its "
                    "method's configured rate (train.lr_by_method: as in Table 4, 4-bit LoRA methods may run at a "
                    f"higher rate than BF16 LoRA; here {_rates(cfg)}), so \"quantization alone\" includes any "
                    "difference of rate.", ""], []

    def effect(name: str, a: tuple, b: tuple) -> None:
        tally: list[str] = []
        parts = [f"{what} {_diff_text(stats[a][key], stats[b][key], digits, tally)}"
                 for what, key, digits in (("entropy at step 0", "entropy0", 3), ("mean entropy", "entropy", 3),
                                           ("reward growth", "growth", 3), ("held-out pass@1", "pass1", 1))]
        out.append(f"- **{name}** ({rows[a]} - {rows[b]}): " + "; ".join(parts) + ".")
        summary.append(f"{name}: {_count(tally)}")

    if bf16_aqn in rows:
        effect("Noise alone", bf16_aqn, bf16)
    else:
        out.append("- Noise alone: not run (train.ablations.aqn_methods does not list lora).")
    effect("Quantization alone", nvfp4, bf16)
    effect("Noise on NVFP4", qerl, nvfp4)
    no_aqn = [k for k in (bf16, nvfp4) if k in stats]
    with_aqn = [k for k in (bf16_aqn, qerl) if k in stats]
    out.append("- Rollout-train mismatch, mean per-token k3 KL over steps: without AQN "
               + ", ".join(f"{rows[k]} {beyond.sci(stats[k]['mismatch_kl'])}" for k in no_aqn)
               + " (float rounding between the sampler and the teacher-forced forward); with AQN "
               + ", ".join(f"{rows[k]} {beyond.sci(stats[k]['mismatch_kl'])} (IS ratio p99 "
                           f"{_fmt(stats[k]['is_p99'], 4)}, max {_fmt(stats[k]['is_max'], 3)})" for k in with_aqn)
               + ".")
    for key in [k for k in rows if k[1].startswith("tis")]:
        tally: list[str] = []
        parts = [f"{what} {_diff_text(stats[key][k], stats[qerl][k], digits, tally)}"
                 for what, k, digits in (("reward growth", "growth", 3), ("held-out pass@1", "pass1", 1))]
        parts.append(f"mismatch KL {beyond.sci(stats[key]['mismatch_kl'])} vs "
                     f"{beyond.sci(stats[qerl]['mismatch_kl'])}")
        out.append(f"- **TIS** ({rows[key]} - QeRL): " + "; ".join(parts) + ".")
        summary.append(f"TIS {key[1]}: {_count(tally)}")
    out.append("")
    return out, "; ".join(summary) + "."


def _rates(cfg: dict) -> str:
    tr = cfg["train"]
    return ", ".join(f"{m} {tr['lr_by_method'].get(m, tr['lr']):g}" for m in ("lora", "nvfp4_lora", "qerl"))


def _std(xs: list[float]) -> float:
    m = sum(xs) / len(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1)) if len(xs) > 1 else float("nan")


# --------------------------------------------------------------------------------------------- document
def render_claims(cfg: dict) -> str:
    """The claim-by-claim comparison of one scale's results, as Markdown.

    Raises:
        ValueError: a missing or malformed input file (naming it).
    """
    seen: list[Context] = []
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    speed, big = _speed(cfg, seen), _memory_32b(cfg, seen)
    sweep = batch_sweep.sweep_claim_lines(_context(cfg, Needs(measured=("rollout.csv",)), seen))  # by batch
    timing = _cpu_timing(cfg, seen)
    (c0, s0), (c3, s3), (c4, s4), (c5, s5) = (_learning(cfg, seen), _claim3(cfg, seen), _claim4(cfg, seen),
                                              _claim5(cfg, seen))
    c6, s6 = _beyond(cfg, seen)
    prov = Context(cfg, Needs()).prov
    for ctx in seen:  # the seeds, commits and hardware of every file read
        prov.seeds = sorted(set(prov.seeds) | set(ctx.prov.seeds))
        prov.commits |= ctx.prov.commits
        prov.hardware |= ctx.prov.hardware
        prov.sources += [s for s in ctx.prov.sources if s not in prov.sources]
    lines = [f"# Headline claims of QeRL ({paper.PAPER_ID}) at the {cfg['scale']} scale", "",
             f"Generated by `qerl claims` on {date} from the DAG's own results; {prov.line()}.", "",
             "Verdicts compare two means over seeds: **holds** when the difference is above 2 standard errors (from "
             "the seeds' spread), **contradicted** when it is below -2 SE, **within noise** otherwise. The paper's "
             "numbers are in ../shared/paper/REPORTED.md and beside ours in every table. Differences treat the "
             "seeds of two methods as independent samples.", "", "## Summary", "",
             f"0. RL learns at this scale (the precondition of claims 3-5): {s0}",
             f"1. Speed: {speed[1] if speed else 'not measured at this commit.'}"
             + (f" By batch regime: {sweep[1]}." if sweep else ""),
             f"2. 32B on one 80 GB GPU: {big[1] if big else 'not measured at this commit.'}",
             f"3. Entropy and reward growth, 4-bit LoRA vs BF16 LoRA: {s3}",
             f"4. Accuracy: {s4}",
             f"5. Exponential AQN schedule most stable late: {s5}",
             f"6. Beyond the paper (noise vs quantization, rollout-train mismatch, TIS): {s6}", ""]
    claim = 0

    def head(text: str) -> None:
        nonlocal claim
        claim += 1
        lines.extend([f"## {claim}. {text}", ""])

    lines += ["## 0. RL learns at this scale", "",
              "Claims 3-5 compare how methods learn; they mean something only where RL moves reward and held-out "
              "accuracy beyond the seeds' noise.", "", *c0]
    head(paper.CLAIMS[0])
    if speed:
        lines += speed[0]
    else:
        lines += ["Not measured: no committed rollout.csv / e2e.csv / memory.csv under results/measured/<gpu>/, so "
                  "Tables 3 and 5-8 read \"not measured\". This scale's training runs do not test the claim: on a "
                  "CPU the 4-bit layers go through the torch reference (dequantize, then matmul), not the GPU "
                  "kernels the claim is about.", ""]
    if sweep:
        lines += sweep[0]
    if timing:
        lines += ["For the record, this scale's own step phases (GRPO task, mean over steps and seeds; "
                  f"{cfg['scale']} hardware, not the claim's setting):", "", *timing, ""]
    head(paper.CLAIMS[1])
    lines += (big[0] if big else
              ["Not measured: no committed 32B memory or step-time measurement under results/measured/<gpu>/.", ""])
    head(paper.CLAIMS[2])
    lines += c3
    head(paper.CLAIMS[3])
    lines += c4
    head(paper.CLAIMS[4])
    lines += c5
    lines += ["## 6. Beyond the paper: is it the noise or the quantization?", "", *c6]
    return "\n".join(lines).rstrip() + "\n"


def markdown_to_html(text: str, title: str) -> str:
    """A Markdown document (CommonMark with tables; raw HTML in it is escaped) as a self-contained HTML page."""
    from markdown_it import MarkdownIt

    return tables.html_page(title, MarkdownIt("commonmark", {"html": False}).enable("table").render(text))


def add_arguments(parser) -> None:
    """Arguments of `qerl claims`."""
    parser.add_argument("--config", required=True, help="YAML config file (the one the runs were made with)")
    parser.add_argument("--out", required=True, help="Markdown file to write (e.g. results/tiny/claims.md)")
    parser.add_argument("--html", default=None, help="also write the document as an HTML page here")


def run(args) -> int:
    from qerl.config import load_config

    cfg = load_config(args.config, check_data=False)
    text = render_claims(cfg)
    print(write_text(args.out, text))
    if args.html:
        title = f"Headline claims of QeRL at the {cfg['scale']} scale"
        print(write_text(args.html, markdown_to_html(text, title)))
    return 0
