"""`qerl render`: draw one paper table or figure (or all of them) beside the paper's numbers.

Why: the Snakemake `render` rules call this once per artifact; it also runs by hand, without Snakemake, on whatever
runs exist (`--allow-missing` skips absent run/eval files and says so in the caption).

Run:
    qerl render --config config/config.yaml --artifact table1
    qerl render --config config/config.yaml --artifact fig8 --out /tmp/figs
    qerl render --config config/config.yaml --artifact all --allow-missing

Outputs: results/<scale>/tables/<id>.{md,tex,csv,html} or results/<scale>/figures/<id>.{png,pdf} (or under --out),
each written atomically; the written paths are printed, one a line.
"""
from __future__ import annotations

from qerl.config import load_config
from qerl.report.registry import ARTIFACTS, render_artifact

__all__ = ["add_arguments", "run"]

RENAMED = {"--out-dir": "--out"}  # the old spelling still works (qerl.args.parse_args)


def add_arguments(parser) -> None:
    """Arguments of `qerl render`."""
    parser.add_argument("--config", required=True, help="YAML config file (the one the runs were made with)")
    parser.add_argument("--artifact", required=True,
                        help=f"artifact id or 'all'; one of: {', '.join(ARTIFACTS)}")
    parser.add_argument("--out", default=None, metavar="DIR",
                        help="output folder (default: results/<scale>/tables or results/<scale>/figures)")
    parser.add_argument("--allow-missing", action="store_true",
                        help="skip missing run/eval files (named in the caption) instead of failing")


def run(args) -> int:
    """Render the requested artifact(s).

    Raises:
        ValueError: unknown artifact id, bad config, missing or malformed input (the CLI prints it on one line).
    """
    cfg = load_config(args.config, check_data=False)
    ids = list(ARTIFACTS) if args.artifact == "all" else [args.artifact]
    for artifact_id in ids:
        for path in render_artifact(artifact_id, cfg, args.out, allow_missing=args.allow_missing):
            print(path)
    return 0
