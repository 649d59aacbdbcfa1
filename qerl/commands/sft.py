"""`qerl sft --config FILE --base DIR --out DIR`: the small scale's supervised warm-up before RL
(qerl.models.sft.run_sft); prints rows kept, epochs, steps, seconds and the final loss."""
from __future__ import annotations

import json

from qerl.config import load_config

__all__ = ["add_arguments", "run"]


def add_arguments(parser) -> None:
    """Arguments of `qerl sft`."""
    parser.add_argument("--config", required=True, help="YAML config (reads sft, data, prompt)")
    parser.add_argument("--base", required=True, help="the converted model folder (prepare_model's output)")
    parser.add_argument("--out", required=True, help="the fine-tuned model folder to write")
    parser.add_argument("--device", default="cpu",
                        help="cpu (default, as every stage's), cuda, cuda:N, or auto (a CUDA GPU when there is one)")
    parser.add_argument("--threads", type=int, default=1, help="CPU threads")


def run(args) -> int:
    import torch

    from qerl.models.sft import run_sft

    torch.set_num_threads(args.threads)
    info = run_sft(load_config(args.config), args.base, args.out, args.device)
    print(json.dumps({k: info[k] for k in ("rows_kept", "epochs", "steps", "seconds", "final_loss")}))
    return 0
