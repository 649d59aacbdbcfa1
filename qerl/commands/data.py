"""`qerl data --config FILE [--out MANIFEST]`: provide every benchmark file the config needs, then write the manifest.

The work is qerl.data.fetch.provide (download and conversion when a file is missing, data.download is true and the
hub answers; otherwise a message naming each file to put where).
"""
from __future__ import annotations

import json

from qerl.data.fetch import provide

__all__ = ["RENAMED", "add_arguments", "run"]

RENAMED = {"--timeout": "--timeout-s"}  # the old spelling still works (qerl.args.parse_args)


def add_arguments(parser) -> None:
    """Arguments of `qerl data`."""
    parser.add_argument("--config", required=True, help="config YAML (data.root, data.benchmarks, data.download)")
    parser.add_argument("--out", default=None, help="write the manifest (rows, sha256 per file) to this JSON path")
    parser.add_argument(
        "--timeout-s", type=float, default=3.0, help="seconds to wait for the hub before treating it as offline"
    )


def run(args) -> int:
    manifest = provide(args.config, args.out, args.timeout_s)
    print(json.dumps({rel: info["rows"] for rel, info in manifest["files"].items()}))
    return 0
