"""`qerl status`: one table of every training run a config makes, where it stands (qerl/status.py reads the files).

Run: `qerl status` (the default config and its results folder), `qerl status --results /copied/results/tiny`
(a results folder from elsewhere: its own effective config, R/config.yaml, gives the runs), `--format tsv|json` for
scripts, `--workdir DIR` for the folder whose .snakemake/ holds Snakemake's locks (default: here).
"""
from __future__ import annotations

import sys
from pathlib import Path

__all__ = ["add_arguments", "run"]


def add_arguments(parser) -> None:
    """Arguments of `qerl status`."""
    parser.add_argument("--config", default=None,
                        help="YAML config (default: <results>/config.yaml when --results is given, else "
                             "config/config.yaml)")
    parser.add_argument("--results", default=None, help="results folder R = <results_dir>/<scale> (default: the "
                                                        "config's)")
    parser.add_argument("--workdir", default=".", help="the workflow folder holding .snakemake/ (default: here)")
    parser.add_argument("--format", choices=["table", "tsv", "json"], default="table", help="output format")


def run(args) -> int:
    """Print the status report; exit status 0."""
    from qerl.config import load_config
    from qerl.status import collect_status, format_json, format_table, format_tsv

    config = args.config or (str(Path(args.results) / "config.yaml") if args.results else "config/config.yaml")
    cfg = load_config(config, check_data=False)
    report = collect_status(cfg, args.results, args.workdir)
    sys.stdout.write({"table": format_table, "tsv": format_tsv, "json": format_json}[args.format](report))
    return 0
