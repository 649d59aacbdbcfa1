"""`qerl train`: train one run (task, method, variant, seed), then evaluate the trained policy in the same process;
several runs of one (task, method) one after the other in one process.

Why here, in the CLI layer: training (qerl.rl) and evaluation (qerl.evaluate) are separate stages that know nothing
of each other; a training job of the DAG chains them so the trained weights are evaluated without a second process
start or a reload. Rank 0 evaluates and writes eval.json (the rule's last output, written last and atomically);
under torchrun the other ranks stop after training.

Several runs (`--seed 0 1 2 --out DIR0 DIR1 DIR2`, or `--variant default rank8 --seed 0 0 --out ...`: the i-th
variant, seed and folder make the i-th run; one variant applies to every seed): each run is trained, evaluated and
written exactly as by its own `qerl train` call (every run seeds its own randomness: qerl.rl.trainer,
qerl.evaluate.run), so its files are the same; the process start-up (interpreter, torch, transformers, peft and
lm-eval imports: ~8 CPU-seconds, measured on a 2-core Intel Xeon) is paid once instead of once per run. The tiny
scale's DAG trains the runs of a (task, method) this way (resources.train.group_runs; workflow/rules/train.smk).
Each run keeps its own checkpoint, so a rerun resumes each where it stopped.

Run: `qerl train --config config/config.yaml --task tiny_grpo --method qerl --variant default --seed 0
      --base results/tiny/models/tiny/base --out results/tiny/runs/tiny_grpo/tiny/qerl/default/seed0`
     `... --seed 0 1 2 --out .../seed0 .../seed1 .../seed2` (three runs, one process)
     `torchrun --nproc_per_node 2 -m qerl.cli train ...` (same arguments) for two GPUs.
"""
from __future__ import annotations

import json
import time
from pathlib import Path

import torch

from qerl.args import add_list
from qerl.contract.paths import EVAL_FILE, task_benchmarks
from qerl.contract.variants import VARIANT_FORMS

__all__ = ["add_arguments", "evaluate_trained", "run"]


def add_arguments(parser) -> None:
    """Arguments of `qerl train`."""
    parser.add_argument("--config", required=True, help="YAML config")
    parser.add_argument("--task", required=True, help="a key of train.tasks")
    parser.add_argument("--method", required=True, help="full, lora, qlora, mxfp4_lora, nvfp4_lora or qerl")
    add_list(parser, "--variant", default=["default"],
             help=f"{VARIANT_FORMS}; several: the i-th run's variant (one: every run's)")
    add_list(parser, "--seed", item_type=int, default=[0], help="the run's seed; several: one run per seed, in order")
    parser.add_argument("--base", required=True, help="base model folder")
    parser.add_argument("--quantized", default=None, help="quantized checkpoint folder (NVFP4/MXFP4/NF4 methods)")
    parser.add_argument("--data", default=None, help="tiny scale data folder (default results/<scale>/data/tiny)")
    parser.add_argument("--out", required=True, nargs="+", help="run folder; one per --seed, in the same order")
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
    """Train, then (rank 0) evaluate and write eval.json, for each run (variant, seed, out) in order; returns the
    exit status.

    Raises:
        ValueError: not one --out folder per seed, not one variant or one per seed (or a bad config, as
            resolve_settings).
    """
    from qerl.config import load_config
    from qerl.rl.distributed import init_distributed, shutdown
    from qerl.rl.settings import resolve_settings

    seeds = " ".join(map(str, args.seed))
    if len(args.out) != len(args.seed):
        raise ValueError(f"--seed gives {len(args.seed)} seed(s) ({seeds}) but --out {len(args.out)} run folder(s); "
                         f"give one folder per seed, in the same order")
    variants = args.variant * len(args.seed) if len(args.variant) == 1 else args.variant
    if len(variants) != len(args.seed):
        raise ValueError(f"--variant gives {len(args.variant)} variants ({' '.join(args.variant)}) for "
                         f"{len(args.seed)} seeds ({seeds}); give one variant, or one per seed in the same order")
    cfg = load_config(args.config)
    torch.set_num_threads(cfg["train"]["threads"])
    settings = [resolve_settings(cfg, args.task, args.method, v, seed) for v, seed in zip(variants, args.seed)]
    ctx = init_distributed()  # torchrun / accelerate launch: one process per GPU; otherwise a no-op
    try:
        for s, out in zip(settings, args.out):
            _train_and_evaluate(args, cfg, s, out, ctx)
        return 0
    finally:
        shutdown(ctx)


def _train_and_evaluate(args, cfg: dict, s, out: str, ctx) -> None:
    """One run: train it into `out`, then (rank 0) evaluate it and write eval.json last."""
    from qerl.evaluate.run import write_results
    from qerl.provenance import provenance
    from qerl.rl.trainer import train

    tiny_test = Path(args.data) / "test.jsonl" if args.data else None
    device = args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    if str(device).startswith("cuda") or ctx.distributed and torch.cuda.is_available():
        # float32 matmuls (full fine-tuning keeps float32 weights) on the tensor cores as TF32: on an H100 the
        # small scale's full fine-tuning update took 1.39 s instead of 1.87 s a step, its log-probs 0.20 instead of
        # 0.41 (qerl.profiling.train_trace --tf32); bfloat16 paths are unaffected
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    result = train(cfg, s, args.base, out, quantized_dir=args.quantized, data_dir=args.data,
                   progress=not args.no_progress, dist_ctx=ctx, device=device)
    if not ctx.is_main:  # rank 0 evaluates and writes eval.json; the other ranks are done
        return
    info = {"method": s.method, "variant": s.variant, "task": s.task, "base": str(args.base),
            "quantized": args.quantized}
    t0 = time.perf_counter()
    evaluation = evaluate_trained(cfg, s, result["policy"].sampling_model(), result["tokenizer"], info, tiny_test)
    seconds = {**result["seconds"], "evaluate": round(time.perf_counter() - t0, 2)}
    evaluation["provenance"] = provenance(args.config)
    evaluation["train"] = {"steps": result["steps"], "final": result["final"], "settings": s.__dict__,
                           "seconds": seconds}
    if ctx.distributed:
        evaluation["train"]["world_size"] = ctx.world_size
    write_results(evaluation, Path(out) / EVAL_FILE)  # the rule's last output: written last, atomically
    summary = {n: round(b["pass_at_1"], 2) for n, b in evaluation["benchmarks"].items()}
    print(json.dumps({"variant": s.variant, "seed": s.seed, "steps": result["steps"],
                      "final_reward": result["final"].get("reward"), "pass@1": summary, "seconds": seconds}),
          flush=True)
