"""The run grid: which training runs (task, method, variant, seed) a config makes, computed once.

Why: the Snakefile's targets (workflow/rules/common.smk) and the report (which runs a table or figure reads, and which
it says were not run) must agree on the grid; a run the DAG does not make would otherwise be read as missing, and a
run it makes but no artifact reads would be wasted. The DAG takes its targets from `train_runs`, and
tests/report/test_grid.py checks that every run an artifact of the shipped configs reads is in it.

The grid (README "What the DAG runs"): every task's methods on the config's seeds; on the ablation task
(train.ablations.task, default the first task) its method's AQN schedules, noaqn, LoRA ranks and trainable norms,
and the lr ablations, on the ablation seeds; beyond the paper, on the main seeds, AQN on the methods without it and
truncated importance sampling. A variant that changes nothing for its method is the default run
(qerl.contract.variants.canonical_variant), made once.

No torch import: the Snakefile calls this at parse time.
"""
from __future__ import annotations

from qerl.contract.variants import aqn_variant, canonical_variant, lr_variant, rank_variant, tis_variant

__all__ = ["task_methods", "train_runs"]


def task_methods(cfg: dict, task: str) -> list[str]:
    """The methods trained on `task`: train.tasks.<task>.methods, or all of train.methods when that is empty."""
    train = cfg.get("train") or {}
    listed = (train.get("tasks") or {}).get(task, {}).get("methods")
    return list(listed) if listed else list(train.get("methods", []))


def train_runs(cfg: dict) -> list[tuple[str, str, str, int]]:
    """(task, method, variant, seed) of the main runs (each task's methods) and of the ablations (their task only),
    in the DAG's order, each once.

    Args:
        cfg: a validated config (qerl.config.load_config).
    """
    tr, ab = cfg["train"], cfg["train"]["ablations"]
    runs = [(t, m, "default", s) for t in tr["tasks"] for m in task_methods(cfg, t) for s in cfg["seeds"]]
    task = ab["task"] or next(iter(tr["tasks"]))
    methods = task_methods(cfg, task)
    variants = []
    if ab["method"] in methods:
        variants += [(ab["method"], aqn_variant(k)) for k in ab["aqn_schedules"]]
        variants += [(ab["method"], "noaqn")] if ab["noaqn"] else []
        variants += [(ab["method"], rank_variant(r)) for r in ab["ranks"]]
    variants += [(m, lr_variant(lr)) for m in ab["lr_methods"] if m in methods for lr in ab["lrs"]]
    variants += [(ab["method"], "norms")] if ab["norms"] and ab["method"] in methods else []
    runs += [(task, m, v, s) for m, v in variants for s in ab["seeds"]
             if canonical_variant(cfg, m, v) == v]  # a variant equal to the default run is that run
    # beyond the paper, on the main seeds: AQN on methods without it, truncated importance sampling
    main = [(m, aqn_variant(tr["aqn"]["schedule"])) for m in ab["aqn_methods"] if m in methods]
    main += [(ab["method"], tis_variant(c)) for c in ab["tis_caps"] if ab["method"] in methods]
    runs += [(task, m, v, s) for m, v in main for s in cfg["seeds"]
             if canonical_variant(cfg, m, v) == v and (task, m, v, s) not in runs]
    return runs
