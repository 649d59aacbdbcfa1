"""`qerl samples`: write the report's samples page (qerl/report/samples.py builds it from the runs' rollout files).

Run: `qerl samples --config results/tiny/config.yaml --out results/tiny/samples.html` (the DAG's rule `samples`).
"""
from __future__ import annotations

__all__ = ["add_arguments", "run"]


def add_arguments(parser) -> None:
    """Arguments of `qerl samples`."""
    parser.add_argument("--config", required=True, help="YAML config (the effective config R/config.yaml)")
    parser.add_argument("--out", required=True, help="the HTML page to write")
    parser.add_argument("--per-step", type=int, default=3, help="prompts shown per method and step")
    parser.add_argument("--chars", type=int, default=300, help="completions are cut to this many characters")


def run(args) -> int:
    """Write the page atomically and print its path."""
    from qerl.config import load_config
    from qerl.io import write_text
    from qerl.report.samples import render_samples

    cfg = load_config(args.config, check_data=False)
    print(write_text(args.out, render_samples(cfg, per_step=args.per_step, chars=args.chars)))
    return 0
