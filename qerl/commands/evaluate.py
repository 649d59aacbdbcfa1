"""`qerl evaluate --config FILE --base DIR [--format F] [--adapter DIR] ...`: pass@1 of a model through lm-eval
(qerl.evaluate.run.evaluate_model), built by the policy core as training builds it; prints one line per benchmark
and writes the results JSON (qerl.evaluate.run.write_results)."""
from __future__ import annotations

import sys

from qerl.args import add_list
from qerl.config import load_config
from qerl.evaluate.tasks import EvalSettings, check_benchmarks

__all__ = ["RENAMED", "add_arguments", "run"]

RENAMED = {"--model": "--base"}  # the old spelling still works (qerl.args.parse_args)


def add_arguments(parser) -> None:
    """Arguments of `qerl evaluate`."""
    parser.add_argument("--config", default="config/config.yaml",
                        help="YAML config (reads evaluate, data.root, prompt, model.dtype; default config/config.yaml)")
    parser.add_argument("--base", required=True, metavar="DIR", help="checkpoint folder of the base model")
    parser.add_argument("--format", default="bf16", choices=["bf16", "nf4", "mxfp4", "nvfp4"],
                        help="weight format applied after loading (bf16 = unquantized, in model.dtype)")
    parser.add_argument("--quantized", default=None, metavar="DIR",
                        help="quantized checkpoint of the quantization stage (replaces round-to-nearest; "
                             "--format must match)")
    parser.add_argument("--adapter", default=None, metavar="DIR", help="peft LoRA adapter folder (checked active)")
    add_list(parser, "--benchmarks", default=None, metavar="NAME",
             help="gsm8k math500 aime24 aime25 amc23 tiny (default: evaluate.benchmarks)")
    parser.add_argument("--limit", type=int, default=None, metavar="N", help="first N problems of each benchmark")
    add_list(parser, "--seed", item_type=int, default=[0],
             help="sampling seed (default 0); several: one evaluation per seed of the model built once, in order")
    parser.add_argument("--method", default=None, help="method name recorded in the results (e.g. nvfp4)")
    parser.add_argument("--data-root", default=None, help="override data.root (folder of <benchmark>/test.jsonl)")
    parser.add_argument("--tiny-test", default=None, help="the tiny held-out split (default: from results_dir)")
    parser.add_argument("--n-repeats", type=int, default=None, help="override evaluate.n_repeats")
    parser.add_argument("--max-new-tokens", type=int, default=None, help="override evaluate.max_new_tokens")
    parser.add_argument("--batch-size", type=int, default=None, help="override evaluate.batch_size")
    parser.add_argument("--device", default="cpu", help="torch device (default cpu)")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    parser.add_argument("--out", default=None, nargs="+", metavar="FILE",
                        help="write the results JSON here (atomically); one file per --seed, in the same order")


def run(args) -> int:
    """Build the model once, evaluate it for each seed (each seed's results are those of its own call: sampling is
    seeded from the seed and the benchmark alone) and write each seed's results JSON; returns the exit status.

    Raises:
        ValueError: an --out list whose length is not the number of seeds (or bad config, data or settings).
    """
    import torch

    from qerl.evaluate.run import evaluate_model, write_results
    from qerl.memory import peak_memory_bytes
    from qerl.policy import build_policy

    if args.out is not None and len(args.out) != len(args.seed):
        raise ValueError(f"--seed gives {len(args.seed)} seed(s) ({' '.join(map(str, args.seed))}) but --out "
                         f"{len(args.out)} file(s); give one results file per seed, in the same order")
    if args.threads:
        torch.set_num_threads(args.threads)
    overrides = {"data": {"root": args.data_root}} if args.data_root else None
    cfg = load_config(args.config, overrides=overrides, check_data=False)
    names = check_benchmarks(args.benchmarks) if args.benchmarks else None
    settings = EvalSettings.from_config(cfg, limit=args.limit, n_repeats=args.n_repeats,
                                        max_new_tokens=args.max_new_tokens, batch_size=args.batch_size)
    names = names or list(settings.benchmarks)
    policy = build_policy(args.format, args.base, quantized=args.quantized, adapter=args.adapter,
                          dtype=cfg["model"]["dtype"], device=args.device, nf4_decode=cfg["model"]["nf4_decode"])
    info = {**policy.info, "method": args.method}
    for i, seed in enumerate(args.seed):
        results = evaluate_model(policy.model, policy.tokenizer, names, cfg, seed, settings=settings,
                                 tiny_test=args.tiny_test, require_adapter=args.adapter is not None, model_info=info,
                                 progress=True)
        for name, r in results["benchmarks"].items():
            stderr = "n/a" if r["stderr"] is None else f"{r['stderr']:.2f}"
            levels = "  ".join(f"L{k} {v['pass_at_1']:.1f}" for k, v in r["per_level"].items())
            print(f"{name} (seed {seed}): pass@1 {r['pass_at_1']:.2f} % +/- {stderr}, strict "
                  f"{r['pass_at_1_strict']:.2f} % (n={r['n_problems']} x {r['n_repeats']} repeats, "
                  f"{r['completion_tokens_mean']:.0f} tokens/completion, {r['truncated_pct']:.1f} % truncated, "
                  f"answer found {r['answer_found_pct']:.1f} %, formatted {r['formatted_pct']:.1f} %, "
                  f"{r['seconds']:.0f} s) {levels}".rstrip())
        if args.out:
            results["peak_memory_bytes"] = peak_memory_bytes()  # the job's so far, loading included (qerl.memory)
            write_results(results, args.out[i])
        sys.stdout.flush()
    return 0
