"""Learning of the small scale pooled over the H100 runs that trained with the same settings: reward growth and
held-out GSM8K gain per method, over every seed of runs 8, 9, 12, 13 and 14 (results/measured/h100/small/).

Why: the issue's learning targets ask 3 seeds of one run to separate RL's effect from noise (reward growth > 3 SE,
held-out gain > 2 SE). At SmolLM2-135M and 30 GRPO steps, RL moves GSM8K test by well under one evaluation's binomial
SE (~0.6 points) plus the seed-to-seed spread, so one run passes or fails by chance; the pooled numbers say how large
the effect is and how many seeds it takes. The runs share the small config's training settings (GSM8K level 2,
16 prompts x 8, lr 3e-4, 4 updates per rollout, 30 steps, 256-token rollouts, 512-token evaluations); the code between
them changed the speed of sampling and decoding, not what is trained. Held-out gains compare each seed with the
untrained model of the same weight format evaluated in the same run (each run made its own SFT base), only where that
run evaluated it; the SE adds the untrained means' own spread.

    python tests/tools/pool_learning.py            # a Markdown table
"""
from __future__ import annotations

import collections
import csv
import math
import statistics as st
import sys
from pathlib import Path

from qerl.contract.methods import METHODS

ROOT = Path(__file__).resolve().parents[2] / "results" / "measured" / "h100" / "small"
RUNS = ("run8", "run9", "run12", "run13", "run14")
TRAINED = ("full", "lora", "qerl", "nvfp4_lora", "qlora", "mxfp4_lora")  # the small scale's GRPO methods


def load(root: Path = ROOT):
    """(training rows by (run, method), untrained GSM8K pass@1 by (run, format)); run 9's machines A/B as one run."""
    runs, untrained = collections.defaultdict(list), collections.defaultdict(list)
    with open(root / "training_runs.csv") as f:
        for r in csv.DictReader(f):
            if r["steps"] == "30":
                runs[(r["run"].rstrip("AB"), r["method"])].append(r)
    with open(root / "untrained_evals.csv") as f:
        for r in csv.DictReader(f):
            if r["benchmark"] == "gsm8k":
                untrained[(r["run"].rstrip("AB"), r["format"])].append(float(r["pass_at_1"]))
    return runs, untrained


def pooled(method: str, runs, untrained) -> dict:
    """Reward growth (last quarter - first quarter) and held-out gain over the seeds of RUNS, with their SEs."""
    growth = [float(r["last_quarter_reward"]) - float(r["first_quarter_reward"])
              for run in RUNS for r in runs.get((run, method), [])]
    gains, untrained_var, n_runs = [], 0.0, 0
    for run in RUNS:
        rows = [r for r in runs.get((run, method), []) if r["heldout_pass_at_1"]]
        base = untrained.get((run, METHODS[method].weights), [])
        if rows and len(base) >= 2:
            gains += [float(r["heldout_pass_at_1"]) - st.mean(base) for r in rows]
            untrained_var += st.variance(base) / len(base)
            n_runs += 1
    out = {"seeds": len(growth), "growth": st.mean(growth), "growth_se": st.stdev(growth) / math.sqrt(len(growth))}
    if len(gains) >= 2:
        out.update(heldout_seeds=len(gains), heldout_runs=n_runs, gain=st.mean(gains),
                   gain_se=math.sqrt(st.variance(gains) / len(gains) + untrained_var / n_runs ** 2))
    return out


def main(argv: list[str]) -> int:
    runs, untrained = load(Path(argv[0]) if argv else ROOT)
    print(f"Pooled over {', '.join(RUNS)} (tests/tools/pool_learning.py)\n")
    print("| method | seeds | reward growth, mean ± SE | SE multiple | held-out seeds (runs) "
          "| held-out gain, mean ± SE | SE multiple |")
    print("|---|---|---|---|---|---|---|")
    for method in TRAINED:
        p = pooled(method, runs, untrained)
        held = (f"{p['heldout_seeds']} ({p['heldout_runs']}) | {p['gain']:+.2f} ± {p['gain_se']:.2f} | "
                f"{p['gain'] / p['gain_se']:.1f}") if "gain" in p else "- | - | -"
        print(f"| {method} | {p['seeds']} | {p['growth']:+.4f} ± {p['growth_se']:.4f} | "
              f"{p['growth'] / p['growth_se']:.1f} | {held} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
