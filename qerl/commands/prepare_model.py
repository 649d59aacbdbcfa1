"""`qerl prepare-model --config FILE --out DIR`: write the base checkpoint folder the config's `model` names
(qerl.models.prepare.prepare_model: the small scale's GGUF converted, a hub / local transformers model, or random
weights)."""
from __future__ import annotations

import json

from qerl.config import load_config
from qerl.models.prepare import prepare_model

__all__ = ["add_arguments", "run"]


def add_arguments(parser) -> None:
    """Arguments of `qerl prepare-model`."""
    parser.add_argument("--config", required=True, help="YAML config (reads model.source, model.id)")
    parser.add_argument("--out", required=True,
                        help="output checkpoint folder (e.g. results/small/models/smollm2-135m/base)")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    parser.add_argument("--device", default="cpu",
                        help="where model.source random draws its weights and runs its probe (default cpu)")


def run(args) -> int:
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    print(json.dumps(prepare_model(load_config(args.config, check_data=False), args.out, args.device)))
    return 0
