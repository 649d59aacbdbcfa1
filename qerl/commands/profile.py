"""`qerl profile --archs 7B 3B --out WORK [--publish DIR]`: rollout tokens/s, GRPO step time and memory at the
paper's shapes on one GPU (qerl.profiling.run.profile, whose docstring says what is measured and how). Exit 3 when
--budget-s ran out before every configuration was measured and --publish was asked for (rerun to resume)."""
from __future__ import annotations

from pathlib import Path

from qerl.args import add_list
from qerl.contract.methods import SPEED_METHODS
from qerl.config import load_config

__all__ = ["add_arguments", "run"]


def add_arguments(p) -> None:
    """Arguments of `qerl profile`."""
    add_list(p, "--archs", default=["7B", "3B", "14B", "32B"], metavar="ARCH",
             help="names of qerl.profiling.archs.ARCHS")
    add_list(p, "--methods", default=list(SPEED_METHODS), metavar="METHOD",
             help="methods (qerl/contract/methods.py)")
    add_list(p, "--ranks", item_type=int, default=[16, 32, 64], metavar="R",
             help="LoRA ranks for the batch-1 rollout (Table 9)")
    add_list(p, "--batches", item_type=int, default=[1, 2, 4, 8, 16, 32, 64, 128, 256], metavar="B",
             help="rollout batch sizes at rank 32 (the speed claim across batch sizes, Fig. batch sweep)")
    add_list(p, "--full-batches", item_type=int, empty=True, default=[1, 8], metavar="B",
             help="batches also timed as one complete generation (validates the bucket timing; none: the flag alone)")
    add_list(p, "--e2e-batches", item_type=int, empty=True, default=[2, 4, 8], metavar="B",
             help="GRPO step batch sizes (sequences per step; none: the flag alone)")
    p.add_argument("--prompt", type=int, default=256)
    p.add_argument("--completion", type=int, default=2048)
    add_list(p, "--hf-batches", item_type=int, empty=True, default=[], metavar="B",
             help="also time transformers' generate at these batches")
    p.add_argument("--hf-completion", type=int, default=128)
    p.add_argument("--layers", type=int, default=None, help="build only this many layers (smoke tests)")
    p.add_argument("--config", default=str(Path(__file__).resolve().parents[2] / "config" / "paper.yaml"),
                   help="training config whose settings the GRPO step uses: optimizer, schedule, LoRA alpha / rank, "
                        "clip, KL, updates per rollout, AQN (default: config/paper.yaml)")
    p.add_argument("--task", default=None, help="the train.tasks entry of --config (default: its first GRPO task)")
    p.add_argument("--budget-s", type=float, default=0, help="start no new config after this many seconds")
    p.add_argument("--out", required=True, help="folder of rollout.csv, e2e.csv, memory.csv, rollout_hf.csv "
                   "(appended row by row; rows already there are not measured again, so a cut run resumes)")
    p.add_argument("--publish", default=None, help="when every configuration is measured, copy the CSVs here "
                   "(the DAG's outputs; a run stopped by --budget-s publishes nothing)")


def run(args) -> int:
    from qerl.profiling.run import profile

    done = profile(load_config(args.config, check_data=False), args.out, archs=args.archs, methods=args.methods,
                   ranks=args.ranks, batches=args.batches, full_batches=args.full_batches,
                   e2e_batches=args.e2e_batches, prompt=args.prompt, completion=args.completion,
                   hf_batches=args.hf_batches, hf_completion=args.hf_completion, layers=args.layers, task=args.task,
                   budget_s=args.budget_s, publish_to=args.publish)
    return 0 if done or not args.publish else 3
