"""Claims 0 and 3-6, how the methods learn: does RL move reward and held-out pass@1 at this scale (0, the
precondition of claims 3-5); entropy and reward growth of 4-bit LoRA vs BF16 LoRA (3); accuracy (4); the most stable
AQN schedule (5); and, beyond the paper, noise alone vs quantization alone and what TIS changed (6).

How: accuracy comes from the Table 1 / Table 2 renderers (mean and sample std over seeds); entropy and reward curves
from the runs of Figures 3/4/14 (metrics.jsonl); the schedule ablation from Figure 9's runs; claim 6 from the AQN
table's runs (qerl/report/beyond.py). Verdicts as qerl/report/claims_verdicts.py defines them.
"""
from __future__ import annotations

import math

from qerl.contract import paths
from qerl.contract.methods import LEARNING_METHODS, get_method, method_lr
from qerl.contract.variants import aqn_variant
from qerl.report import beyond
from qerl.report.claims_verdicts import compare, diff_text, fmt, tally_text, tracked_context
from qerl.report.context import Context, Needs, RunSpec, ablation, role_benchmarks, task_name, trained_methods
from qerl.report.inputs import Stat, paper_model_label, summarize
from qerl.report.registry import ARTIFACTS

__all__ = ["learning_claim", "entropy_claim", "accuracy_claim", "schedule_claim", "beyond_claim"]

_FOUR_BIT = ("nvfp4_lora", "mxfp4_lora", "qlora", "qerl")


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
        "growth": summarize([beyond.growth(m["reward"]) for m in per_seed]),
    }


def entropy_claim(cfg: dict, seen: list[Context]) -> tuple[list[str], str]:
    out, summary = [], []
    for role, title in (("grpo", "GRPO task (Figs. 3, 4 bottom, 5)"), ("dapo", "DAPO task (Figs. 4 top, 14)")):
        methods = [m for m in ("lora", *_FOUR_BIT) if m in trained_methods(cfg, role)]
        if task_name(cfg, role) is None or "lora" not in methods or len(methods) < 2:
            out += [f"*{title}*: not run in this config (needs BF16 LoRA and a 4-bit LoRA method).", ""]
            summary.append(f"{role.upper()}: not run")
            continue
        ctx = tracked_context(cfg, Needs(), seen)
        per_seed = {m: ctx.metrics(RunSpec(role, m)) for m in methods}
        stats = {m: _curve_stats(runs) for m, runs in per_seed.items()}
        n_steps = len(per_seed["lora"][0]["reward"])
        out += [f"*{title}*, task `{task_name(cfg, role)}`, {n_steps} steps, mean ± std over seeds; reward growth = "
                "mean reward of the last quarter of the steps minus that of the first quarter.", "",
                "| method | entropy, step 0 | entropy, mean over steps | reward, first quarter | reward, last quarter "
                "| reward growth |", "|---|---|---|---|---|---|"]
        out += [f"| {get_method(m).prose} | {fmt(s['entropy0'])} | {fmt(s['entropy'])} | {fmt(s['reward_first'])} | "
                f"{fmt(s['reward_last'])} | {fmt(s['growth'])} |" for m, s in stats.items()]
        out.append("")
        entropy0, entropy, growth = [], [], []
        for m in methods[1:]:
            a, b = stats[m], stats["lora"]
            out.append(f"- {get_method(m).prose} - BF16 LoRA: entropy at step 0 "
                       f"{diff_text(a['entropy0'], b['entropy0'], 3, entropy0)}; "
                       f"mean entropy {diff_text(a['entropy'], b['entropy'], 3, entropy)}; "
                       f"reward growth {diff_text(a['growth'], b['growth'], 3, growth)}.")
        out.append("")
        summary.append(f"{role.upper()}, {len(methods) - 1} methods: higher mean entropy "
                       f"{tally_text(entropy)}; higher entropy at step 0 {tally_text(entropy0)}; faster reward growth "
                       f"{tally_text(growth)}")
    return out, "; ".join(summary) + "."


# --------------------------------------------------------------------------------------------- claim 4: accuracy
def _accuracy(cfg: dict, table_id: str, role: str, seen: list[Context]) -> tuple[dict[str, Stat], str] | None:
    """{method: pass@1 Stat} of our rows of Table 1/2, and the column they come from; None if the role is not run."""
    if task_name(cfg, role) is None:
        return None
    artifact = ARTIFACTS[table_id]
    table = artifact.renderer(tracked_context(cfg, artifact.needs(cfg), seen), artifact)
    benches = role_benchmarks(cfg, role)
    prefix = f"ours ({cfg['scale']})"
    column = f"{prefix}: {benches[0]}" if len(benches) == 1 else f"{prefix}: avg"
    label = paper_model_label(cfg["model"]["name"])
    out = {}
    for row in table.rows:
        if row.get("model") == label and isinstance(row.get(column), Stat) and row[column].n > 0:
            out.setdefault(row["method"], row[column])
    return out, column


def accuracy_claim(cfg: dict, seen: list[Context]) -> tuple[list[str], str]:
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
                gain = diff_text(acc[m], base, 1) if base is not None else "n/a"
                out.append(f"| {get_method(m).prose} | {fmt(acc[m], 1)} | {fmt(base, 1)} | {gain} |")
        out.append("")
        vs_lora = diff_text(acc["qerl"], acc["lora"], 1)
        out.append(f"- QeRL - BF16 LoRA: {vs_lora} (claim: QeRL >= LoRA).")
        line = f"{title}: QeRL - BF16 LoRA {vs_lora}"
        if "nvfp4_lora" in acc:
            out.append(f"- AQN: QeRL - NVFP4 LoRA without AQN: {diff_text(acc['qerl'], acc['nvfp4_lora'], 1)}.")
        if "full" in acc:
            vs_full = diff_text(acc["qerl"], acc["full"], 1)
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


def learning_claim(cfg: dict, seen: list[Context]) -> tuple[list[str], str]:
    """Does RL move reward and held-out pass@1 at this scale? The precondition of claims 3-5."""
    out, summary = [], []
    for table_id, role in (("table1", "grpo"), ("table2", "dapo")):
        k, title = _LEARN_SE[role], f"{role.upper()} task"
        found = _accuracy(cfg, table_id, role, seen)
        if found is None:
            out += [f"*{title}*: not run in this config.", ""]
            continue
        acc, column = found
        ctx = tracked_context(cfg, Needs(), seen)
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
            out.append(f"| {get_method(m).prose} | {fmt(c['reward_first'])} | {fmt(c['reward_last'])} | {g.mean:+.3f}"
                       f"{f' ± {g_se:.3f} SE' if g_se is not None else ''} | {v_growth} | {fmt(acc[m], 1)} | "
                       f"{fmt(base, 1)} | {gain} | {v_gain} |")
        out.append("")
        summary.append(f"{title}: reward growth above {k} SE for {grew} of {len(methods)} methods, held-out gain "
                       f"above {k} SE for {gained} of {len(methods)}")
    return out, ("; ".join(summary) + ".") if summary else "not run."


# --------------------------------------------------------------------------------------------- claim 5: schedules
def schedule_claim(cfg: dict, seen: list[Context]) -> tuple[list[str], str]:
    needs = ARTIFACTS["fig9"].needs(cfg)
    if not needs.runs:
        return ["Not run in this config (train.ablations.aqn_schedules).", ""], "not run."
    ctx = tracked_context(cfg, needs, seen)
    rows, late_std = [], {}
    for spec in needs.runs:
        per_seed = ctx.metrics(spec)
        half = [m["reward"][len(m["reward"]) // 2:] for m in per_seed]
        std = summarize([_std(h) for h in half])
        mean = summarize([sum(h) / len(h) for h in half])
        name = spec.variant.removeprefix("aqn-")
        late_std[name] = std.mean
        rows.append(f"| {name} | {fmt(mean)} | {fmt(std)} | {len(per_seed)} |")
    best = min(late_std, key=late_std.get)
    seeds = ablation(cfg, "seeds")
    verdict = ("holds" if best == "exponential" else f"not reproduced: the lowest late-step spread is {best}'s")
    note = " (one seed: a single draw per schedule)" if len(seeds) < 2 else ""
    return [f"QeRL with each AQN schedule, train.ablations.seeds {list(seeds)}; the reward of the second half of the "
            "steps: its mean, and its step-to-step std (lower = more stable).", "",
            "| schedule | late reward, mean | late reward, std over steps | seeds |", "|---|---|---|---|", *rows, "",
            f"- Most stable late (lowest std): {best}: **{verdict}**{note}.", ""], f"**{verdict}**{note}."


# --------------------------------------------------------------------------------------------- beyond the paper
def beyond_claim(cfg: dict, seen: list[Context]) -> tuple[list[str], str]:
    """Noise alone, quantization alone, and what TIS changed, from the AQN table's runs (qerl/report/beyond.py)."""
    variants = beyond.aqn_variants(cfg)
    rows = {(m, v): label for m, v, label, _ in variants}
    schedule = cfg["train"]["aqn"]["schedule"]
    bf16, bf16_aqn = ("lora", "default"), ("lora", aqn_variant(schedule))
    nvfp4, qerl = ("nvfp4_lora", "default"), ("qerl", "default")
    if not {bf16, nvfp4, qerl} <= set(rows):
        return ["Not run in this config (needs BF16 LoRA, NVFP4 LoRA and QeRL on the GRPO task).", ""], "not run."
    artifact = ARTIFACTS["tableaqn"]
    ctx = tracked_context(cfg, artifact.needs(cfg), seen)
    bench = role_benchmarks(cfg, "grpo")[0]
    stats = {(m, v): beyond.row_stats(ctx, RunSpec("grpo", m, v, paths.METRICS_FILE, label, seeds), bench)
             for m, v, label, seeds in variants}
    out, summary = ["The AQN table (tableaqn) and figure figmismatch; differences of means over seeds, verdicts as "
                    "above (higher entropy, faster reward growth, higher held-out pass@1). Entropy at step 0 cannot "
                    "differ with AQN alone: the schedule's first stage adds no noise (Alg. 1). Each run trains at its "
                    "method's configured rate (train.lr_by_method: as in Table 4, 4-bit LoRA methods may run at a "
                    f"higher rate than BF16 LoRA; here {_rates(cfg)}), so \"quantization alone\" includes any "
                    "difference of rate.", ""], []

    def effect(name: str, a: tuple, b: tuple) -> None:
        tally: list[str] = []
        parts = [f"{what} {diff_text(stats[a][key], stats[b][key], digits, tally)}"
                 for what, key, digits in (("entropy at step 0", "entropy0", 3), ("mean entropy", "entropy", 3),
                                           ("reward growth", "growth", 3), ("held-out pass@1", "pass1", 1))]
        out.append(f"- **{name}** ({rows[a]} - {rows[b]}): " + "; ".join(parts) + ".")
        summary.append(f"{name}: {tally_text(tally)}")

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
                           f"{fmt(stats[k]['is_p99'], 4)}, max {fmt(stats[k]['is_max'], 3)})" for k in with_aqn)
               + ".")
    for key in [k for k in rows if k[1].startswith("tis")]:
        tally: list[str] = []
        parts = [f"{what} {diff_text(stats[key][k], stats[qerl][k], digits, tally)}"
                 for what, k, digits in (("reward growth", "growth", 3), ("held-out pass@1", "pass1", 1))]
        parts.append(f"mismatch KL {beyond.sci(stats[key]['mismatch_kl'])} vs "
                     f"{beyond.sci(stats[qerl]['mismatch_kl'])}")
        out.append(f"- **TIS** ({rows[key]} - QeRL): " + "; ".join(parts) + ".")
        summary.append(f"TIS {key[1]}: {tally_text(tally)}")
    out.append("")
    return out, "; ".join(summary) + "."


def _rates(cfg: dict) -> str:
    return ", ".join(f"{m} {method_lr(cfg, m):g}" for m in LEARNING_METHODS)


def _std(xs: list[float]) -> float:
    m = sum(xs) / len(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1)) if len(xs) > 1 else float("nan")
