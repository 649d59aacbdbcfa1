"""`qerl gen-tiny --config FILE --out DIR`: write the tiny scale's pretrain/rl/test splits (qerl.data.tiny)."""
from __future__ import annotations

import json

from qerl.config import load_config
from qerl.data.tiny import write_splits

__all__ = ["add_arguments", "run"]


def add_arguments(parser) -> None:
    """Arguments of `qerl gen-tiny`."""
    parser.add_argument("--config", required=True, help="YAML config (reads data.tiny)")
    parser.add_argument("--out", required=True, help="output folder for pretrain/rl/test.jsonl")


def run(args) -> int:
    cfg = load_config(args.config)["data"]["tiny"]
    counts = write_splits(args.out, cfg["seed"], cfg["n_pretrain"], cfg["n_rl"], cfg["n_test_per_level"],
                          cfg["levels"], cfg["operand_max"], cfg["direct_fraction"])
    print(json.dumps(counts))
    return 0
