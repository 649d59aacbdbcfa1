"""`qerl pretrain-tiny --config FILE --data DIR --out DIR`: build and pretrain the tiny model
(qerl.models.pretrain.pretrain_tiny); prints what OUT/eval.json holds."""
from __future__ import annotations

import json

from qerl.config import load_config
from qerl.models.pretrain import pretrain_tiny

__all__ = ["add_arguments", "run"]


def add_arguments(parser) -> None:
    """Arguments of `qerl pretrain-tiny`."""
    parser.add_argument("--config", required=True, help="YAML config (reads tiny_model, prompt)")
    parser.add_argument("--data", required=True, help="folder with pretrain.jsonl and test.jsonl (qerl gen-tiny)")
    parser.add_argument("--out", required=True, help="output model folder")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch threads (the Snakemake job's allotment; default tiny_model.pretrain.threads)")


def run(args) -> int:
    print(json.dumps(pretrain_tiny(load_config(args.config), args.data, args.out, threads=args.threads)))
    return 0
