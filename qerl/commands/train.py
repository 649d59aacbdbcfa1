"""`qerl train`: train one run (task, method, variant, seed), then evaluate the trained policy in the same process.

Why here, in the CLI layer: training (qerl.rl) and evaluation (qerl.evaluate) are separate stages that know nothing
of each other; a training job of the DAG chains them so the trained weights are evaluated without a second process
start or a reload. Rank 0 evaluates and writes eval.json (the rule's last output, written last and atomically);
under torchrun the other ranks stop after training.

Run: `qerl train --config config/config.yaml --task tiny_grpo --method qerl --variant default --seed 0
      --base results/tiny/models/tiny/base --out results/tiny/runs/tiny_grpo/tiny/qerl/default/seed0`
     `torchrun --nproc_per_node 2 -m qerl.cli train ...` (same arguments) for two GPUs.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

from qerl.contract.paths import EVAL_FILE, task_benchmarks
from qerl.contract.variants import VARIANT_FORMS

__all__ = ["add_arguments", "evaluate_trained", "run"]


def add_arguments(parser) -> None:
    """Arguments of `qerl train`."""
    parser.add_argument("--config", required=True, help="YAML config")
    parser.add_argument("--task", required=True, help="a key of train.tasks")
    parser.add_argument("--method", required=True, help="full, lora, qlora, mxfp4_lora, nvfp4_lora or qerl")
    parser.add_argument("--variant", default="default", help=VARIANT_FORMS)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--base", required=True, help="base model folder")
    parser.add_argument("--quantized", default=None, help="quantized checkpoint folder (NVFP4/MXFP4/NF4 methods)")
    parser.add_argument("--data", default=None, help="tiny scale data folder (default results/<scale>/data/tiny)")
    parser.add_argument("--out", required=True, help="run folder")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("--device", default="auto",
                        help="auto (a CUDA GPU when there is one, else the CPU), cpu, cuda or cuda:N; under torchrun "
                             "each rank uses its local GPU")


def evaluate_trained(cfg: dict, s, model, tokenizer, info: dict, tiny_test: str | Path | None = None) -> dict:
    """Evaluate a just-trained policy on its task's benchmarks (qerl.contract.paths.task_benchmarks).

    The adapter-active probe guards against evaluating the base model by mistake; an adapter whose lora_B is still
    zero was never updated (every group had equal rewards), which the probe would wrongly call inactive, so the
    probe is required only for an updated adapter.

    Args:
        cfg: the validated config.
        s: the run's settings (qerl.rl.settings.RunSettings).
        model, tokenizer: the trained policy.
        info: what the results record about the model (method, variant, task, base, quantized).
        tiny_test: the tiny held-out split (default: from the config's results folder).

    Returns:
        The results of qerl.evaluate.run.evaluate_model.
    """
    from qerl.evaluate.run import evaluate_model

    lora_b = [p for n, p in model.named_parameters() if "lora_B" in n]
    updated = any(bool(p.detach().abs().sum() > 0) for p in lora_b)
    return evaluate_model(model, tokenizer, task_benchmarks(cfg["train"]["tasks"][s.task]), cfg, s.seed,
                          tiny_test=tiny_test, require_adapter=updated if lora_b else False,
                          model_info={**info, "adapter_updated": updated if lora_b else None})


def run(args) -> int:
    """Train, then (rank 0) evaluate and write eval.json; returns the exit status."""
    from qerl.config import load_config
    from qerl.evaluate.run import write_results
    from qerl.provenance import provenance
    from qerl.rl.distributed import init_distributed, shutdown
    from qerl.rl.settings import resolve_settings
    from qerl.rl.trainer import train

    cfg = load_config(args.config)
    torch.set_num_threads(cfg["train"]["threads"])
    s = resolve_settings(cfg, args.task, args.method, args.variant, args.seed)
    tiny_test = Path(args.data) / "test.jsonl" if args.data else None
    ctx = init_distributed()  # torchrun / accelerate launch: one process per GPU; otherwise a no-op
    device = args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    try:
        result = train(cfg, s, args.base, args.out, quantized_dir=args.quantized, data_dir=args.data,
                       progress=not args.no_progress, dist_ctx=ctx, device=device)
        if not ctx.is_main:  # rank 0 evaluates and writes eval.json; the other ranks are done
            return 0
        info = {"method": s.method, "variant": s.variant, "task": s.task, "base": str(args.base),
                "quantized": args.quantized}
        evaluation = evaluate_trained(cfg, s, result["model"], result["tokenizer"], info, tiny_test)
        evaluation["provenance"] = provenance(args.config)
        evaluation["train"] = {"steps": result["steps"], "final": result["final"], "settings": s.__dict__}
        if ctx.distributed:
            evaluation["train"]["world_size"] = ctx.world_size
        write_results(evaluation, Path(args.out) / EVAL_FILE)  # the rule's last output: written last, atomically
        summary = {n: round(b["pass_at_1"], 2) for n, b in evaluation["benchmarks"].items()}
        print(json.dumps({"steps": result["steps"], "final_reward": result["final"].get("reward"), "pass@1": summary}))
        return 0
    finally:
        shutdown(ctx)
