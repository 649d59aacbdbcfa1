"""Beyond the paper: is it the noise or the quantization, how far the noisy rollout policy drifts, and TIS.

Why: the paper credits quantization noise for higher entropy and faster reward growth but never runs AQN on a BF16
model, so noise and quantization are confounded; AQN perturbs the rollout policy only, so every QeRL step is
slightly off-policy, and nobody reports by how much; truncated importance sampling (TIS) is the usual correction
for quantized rollouts. Two artifacts answer this from the GRPO task's runs:
  * `tableaqn`: the 2 x 2 design (BF16 / NVFP4 x without / with AQN) on the main seeds -- lora, lora/aqn-<schedule>,
    nvfp4_lora, qerl -- plus QeRL with TIS (qerl/tis<C>) and QeRL with trainable RMSNorm weights (qerl/norms, on the
    ablation seeds): entropy at step 0 and mean, reward growth, held-out pass@1 (flexible and strict), and the
    rollout-train mismatch (qerl/rl/mismatch.py) averaged over steps; mean ± std over seeds;
  * `figmismatch`: mismatch_kl over steps for those runs (log scale: without AQN it is float rounding only).
The verdicts ("noise alone", "quantization alone", what TIS changed) are in claims.md (qerl/report/claims.py).

Run: `qerl render --config results/tiny/config.yaml --artifact tableaqn` (the DAG's rule `tableaqn`).
"""
from __future__ import annotations

from qerl.contract import paths
from qerl.contract.variants import aqn_variant, tis_variant
from qerl.report.context import Context, Needs, RunSpec, ablation, task_name, trained_methods
from qerl.report.inputs import Stat, summarize
from qerl.report.tables import Column, Table, over_seeds

__all__ = ["aqn_variants", "tableaqn_needs", "figmismatch_needs", "render_tableaqn", "growth", "row_stats", "sci"]


def aqn_variants(cfg: dict) -> list[tuple[str, str, str, tuple[int, ...] | None]]:
    """(method, variant, row label, seeds or None = the main seeds) of the AQN table, in row order; rows whose method
    the GRPO task does not train, or whose variant the config does not run, are left out."""
    if task_name(cfg, "grpo") is None:
        return []
    schedule = cfg["train"]["aqn"]["schedule"]
    methods = trained_methods(cfg, "grpo")
    method = ablation(cfg, "method")
    rows = [("lora", "default", "BF16, no AQN (BF16 LoRA)", None)]
    if "lora" in ablation(cfg, "aqn_methods"):
        rows.append(("lora", aqn_variant(schedule), f"BF16 + AQN (BF16 LoRA, {aqn_variant(schedule)})", None))
    rows += [("nvfp4_lora", "default", "NVFP4, no AQN (NVFP4 LoRA)", None),
             ("qerl", "default", "NVFP4 + AQN (QeRL)", None)]
    if method == "qerl":
        rows += [("qerl", tis_variant(c), f"QeRL + TIS (cap {float(c):g})", None) for c in ablation(cfg, "tis_caps")]
        if ablation(cfg, "norms"):
            rows.append(("qerl", "norms", "QeRL + trainable RMSNorm (norms)", tuple(ablation(cfg, "seeds"))))
    return [r for r in rows if r[0] in methods]


def _specs(cfg: dict, file: str) -> tuple[RunSpec, ...]:
    return tuple(RunSpec("grpo", m, v, file, label, seeds) for m, v, label, seeds in aqn_variants(cfg))


def tableaqn_needs(cfg: dict) -> Needs:
    """Metrics and eval.json of every row of the AQN table."""
    runs = _specs(cfg, paths.METRICS_FILE) + _specs(cfg, paths.EVAL_FILE)
    return Needs(runs=runs, skipped=() if runs else ("the AQN table (no GRPO task in train.tasks)",))


def figmismatch_needs(cfg: dict) -> Needs:
    runs = _specs(cfg, paths.METRICS_FILE)
    return Needs(runs=runs, skipped=() if runs else ("the mismatch figure (no GRPO task in train.tasks)",))


def growth(rewards: list[float]) -> float:
    """Reward growth of one run: mean of the last quarter of the steps minus the first quarter."""
    k = max(1, len(rewards) // 4)
    return sum(rewards[-k:]) / k - sum(rewards[:k]) / k


def _mean(xs: list[float]) -> float:
    finite = [x for x in xs if x == x]
    return sum(finite) / len(finite) if finite else float("nan")


def row_stats(ctx: Context, spec: RunSpec, benchmark: str) -> dict[str, Stat]:
    """Per-seed quantities of one AQN-table row, summarized over its seeds."""
    per_seed = ctx.metrics(RunSpec(spec.role, spec.method, spec.variant, paths.METRICS_FILE, spec.label, spec.seeds))
    evals = ctx.run_evals(RunSpec(spec.role, spec.method, spec.variant, paths.EVAL_FILE, spec.label, spec.seeds),
                          [benchmark])
    return {
        "entropy0": summarize([m["entropy"][0] for m in per_seed]),
        "entropy": summarize([_mean(m["entropy"]) for m in per_seed]),
        "growth": summarize([growth(m["reward"]) for m in per_seed]),
        "pass1": summarize([e[benchmark].pass_at_1 for e in evals]),
        "strict": summarize([e[benchmark].pass_at_1_strict for e in evals]),
        "mismatch_kl": summarize([_mean(m["mismatch_kl"]) for m in per_seed]),
        "is_p99": summarize([_mean(m["is_ratio_p99"]) for m in per_seed]),
        "is_max": summarize([max(m["is_ratio_max"]) for m in per_seed]),
    }


def sci(x: Stat) -> str:
    """A Stat in scientific notation ("2.47e-05 ± 4.3e-06"): the mismatch spans 1e-14 (rounding) to 1e-4 (AQN)."""
    if x.n == 0 or x.mean != x.mean:
        return "n/a"
    return f"{x.mean:.2e}" + (f" ± {x.std:.1e}" if x.std is not None else "")


_COLUMNS = [("entropy, step 0", "entropy0", 3), ("entropy, mean", "entropy", 3), ("reward growth", "growth", 3),
            ("held-out pass@1", "pass1", 1), ("held-out pass@1, strict", "strict", 1),
            ("mismatch KL, mean", "mismatch_kl", None), ("IS ratio p99, mean", "is_p99", 4),
            ("IS ratio, max", "is_max", 3)]


def render_tableaqn(ctx: Context, artifact) -> Table:
    """The AQN 2 x 2 table (module docstring)."""
    from qerl.report.context import role_benchmarks

    benchmark = role_benchmarks(ctx.cfg, "grpo")[0]
    columns = [Column("run", "key"), Column("seeds", "key")]
    columns += [Column(f"{ctx.ours()}: {name}", "ours", digits or 1) for name, _, digits in _COLUMNS]
    rows = []
    for spec in _specs(ctx.cfg, paths.METRICS_FILE):
        stats = row_stats(ctx, spec, benchmark)
        row = {"run": spec.label, "seeds": str(stats["growth"].n)}
        row.update({f"{ctx.ours()}: {name}": stats[key] if digits else sci(stats[key])
                    for name, key, digits in _COLUMNS})
        rows.append(row)
    caption = (f"{artifact.caption} Task `{task_name(ctx.cfg, 'grpo')}`, held-out benchmark `{benchmark}`; "
               f"{over_seeds(ctx.read_seeds())}. Reward growth: mean reward of the last quarter of the steps minus "
               "the first; mismatch: per-token k3 KL between the sampler's and the clean policy's log-probs of the "
               "sampled tokens, and pi_old / pi_sampler, averaged over steps (the max over all steps and tokens). "
               "Entropy at step 0 is the same with and without AQN: the schedule's first stage adds no noise (Alg. 1). "
               "Strict pass@1 counts only the exact <think> ... </think> <answer> ... </answer> shape.")
    return Table(artifact.id, artifact.title, caption, ctx.prov.fields(), columns, rows, list(ctx.notes))
