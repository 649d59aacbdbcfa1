"""`qerl evaluate`: pass@1 of an in-memory model on the math benchmarks, through lm-eval, with per-sample logs.

Why: the released QeRL evaluator compares only the first character of an answer and never applies the LoRA adapter,
so its numbers cannot be trusted. Here every number can be checked:
- the model (BF16, NVFP4, MXFP4 or NF4 weights, with or without a LoRA adapter; built by the policy core,
  qerl.policy.build_policy, as training builds it) is handed to lm-eval as an
  in-memory `LM` (`qerl.evaluate.lm.QerlLM`), on tasks generated for our local files (`qerl.evaluate.tasks`);
- when the model carries an adapter, the adapter check (`qerl.evaluate.adapter_check`) first proves that the adapter
  changes the model's logits, and stops the evaluation with `AdapterNotActiveError` if it does not;
- pass@1 over repeats and its standard error over problems (`qerl.evaluate.stats`) are recomputed here from the
  per-sample verdicts and must agree with lm-eval's aggregate, and every request's prompt must be the
  chat-formatted prompt we built (no second template);
- the results JSON keeps, for every problem: id, level, gold answer, each completion, its extracted answer, its
  verdict, its token count and why it ended (stop string, EOS or the length limit).

Sampling (the paper, sec. 4): T = 0.6, top-p 0.95, n repeats; the generation limit is `evaluate.max_new_tokens`
(the paper uses 4096 tokens; smaller scales use less, and the results report how many completions hit the limit).
Randomness: one torch.Generator per benchmark seeded from (seed, benchmark name); the global RNG is untouched, so the
trainer can call `evaluate_model` mid-run. AQN noise must be off while evaluating (the trainer's job).

Run::

    qerl evaluate --config config/small.yaml --base results/small/models/smollm2-135m/base \\
        --benchmarks gsm8k math500 --limit 50 --data-root ../shared/data --out results/eval.json
    qerl evaluate --config config/config.yaml --base results/tiny/models/tiny/base --format nvfp4 \\
        --adapter results/tiny/runs/.../adapter --benchmarks tiny --out eval.json

Library (the `qerl train` command evaluates the policy it trained with this)::

    from qerl.evaluate.run import evaluate_model, write_results
    results = evaluate_model(peft_model, tokenizer, ["gsm8k"], cfg, seed=0)

Run the tests: ``pytest tests/evaluate -q``.
"""
from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # lm-eval and datasets must never reach the hub from here
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

import dataclasses
import hashlib
import logging
import platform
import sys
import tempfile
import time
from collections import defaultdict, deque
from contextlib import contextmanager
from pathlib import Path
from typing import Iterable

import torch

from qerl.cli import add_list
from qerl.contract.records import BenchmarkRecord
from qerl.evaluate.adapter_check import check_adapter_active
from qerl.evaluate.stats import pass_at_1_stats
from qerl.evaluate.tasks import (
    FILTER,
    METRIC,
    EvalSettings,
    Grader,
    build_task,
    check_benchmarks,
    load_problems,
    tiny_test_path,
    write_docs,
)

__all__ = [
    "evaluate_benchmark",
    "evaluate_model",
    "write_results",
    "add_arguments",
    "run",
]

RESULTS_VERSION = 1


# ---- one benchmark -----------------------------------------------------------------------------------------------
def _benchmark_seed(seed: int, name: str) -> int:
    return int.from_bytes(hashlib.sha256(f"{seed}:{name}".encode()).digest()[:7], "big")


@contextmanager
def _quiet_libraries():
    """lm-eval logs every task option at INFO and `datasets` draws progress bars: keep the log to our lines."""
    import datasets

    logger = logging.getLogger("lm_eval")
    level = logger.level
    logger.setLevel(logging.ERROR)
    bars = datasets.utils.logging.is_progress_bar_enabled()
    datasets.disable_progress_bars()
    try:
        yield
    finally:
        logger.setLevel(level)
        if bars:
            datasets.enable_progress_bars()


def evaluate_benchmark(model, tokenizer, name: str, problems, settings: EvalSettings, seed: int,
                       instruction: str = "paper", progress: bool = False) -> dict:
    """Run one benchmark through lm-eval and check its numbers against the per-sample verdicts.

    Args:
        model: the in-memory model (eval mode is the caller's business; `evaluate_model` handles it).
        tokenizer: its tokenizer.
        name: benchmark name (for the task and the seed).
        problems: from `qerl.evaluate.tasks.load_problems`.
        settings: sampling, repeats, generation length, batch size.
        seed: the run's seed.
        instruction: prompt.instruction.
        progress: show a progress bar over sampling batches on stderr.

    Returns:
        The benchmark's entry of the results JSON (see `evaluate_model`).

    Raises:
        RuntimeError: lm-eval's prompts, responses or aggregate disagree with ours (a harness bug, never data).
    """
    from lm_eval.evaluator import evaluate

    from qerl.data.prompts import build_prompt
    from qerl.evaluate.lm import QerlLM

    start = time.perf_counter()
    device = next(model.parameters()).device
    generator = torch.Generator(device=device).manual_seed(_benchmark_seed(seed, name))
    lm = QerlLM(model, tokenizer, generator=generator, batch_size=settings.batch_size,
                default_max_new_tokens=settings.max_new_tokens, progress=progress)
    grader = Grader()
    with tempfile.TemporaryDirectory(prefix=f"qerl-eval-{name}-") as tmp, _quiet_libraries():
        docs = write_docs(problems, Path(tmp) / f"{name}.jsonl")
        task = build_task(name, docs, tokenizer, settings, grader, instruction, cache_dir=Path(tmp) / "cache")
        out = evaluate(lm=lm, task_dict={"tasks": {task.task_name: task}, "groups": {}, "group_map": {}},
                       log_samples=True, bootstrap_iters=100 if len(problems) > 1 else 0)
    seconds = time.perf_counter() - start
    logged = sorted(out["samples"][task.task_name], key=lambda s: s["doc_id"])
    if len(logged) != len(problems):
        raise RuntimeError(f"{name}: lm-eval logged {len(logged)} problems, {len(problems)} were given")

    by_prompt: dict[str, deque] = defaultdict(deque)
    for prompt, completion in lm.log:
        by_prompt[prompt].append(completion)
    samples, verdicts = [], []
    for entry in logged:
        i = int(entry["doc"]["doc_index"])
        p = problems[i]
        if entry["doc"]["id"] != p.id:
            raise RuntimeError(f"{name}: lm-eval doc {entry['doc_id']} is {entry['doc']['id']!r}, expected {p.id!r}")
        expected = build_prompt(p.question, tokenizer, instruction)
        context = entry["arguments"][0][0]
        if context != expected:
            raise RuntimeError(f"{name}: lm-eval sent a different prompt than the one built for problem {p.id!r} "
                               f"(a second chat template or a few-shot prefix?):\n{context[:300]!r}")
        texts = list(entry["filtered_resps"][0])
        record = grader.records.get(i)
        if record is None or len(record) != len(texts) or len(texts) != settings.n_repeats:
            raise RuntimeError(f"{name}: problem {p.id!r}: {len(texts)} responses, expected {settings.n_repeats}")
        completions = [by_prompt[context].popleft() for _ in texts]
        if [c.text for c in completions] != texts:
            raise RuntimeError(f"{name}: problem {p.id!r}: lm-eval's responses do not match the sampler's log")
        correct = [c for _, c in record]
        if abs(entry[METRIC] - sum(correct) / len(correct)) > 1e-12:
            raise RuntimeError(f"{name}: problem {p.id!r}: lm-eval metric {entry[METRIC]} != per-sample verdicts")
        verdicts.append(correct)
        samples.append({"doc_index": i, "id": p.id, "level": p.level, "gold": p.answer, "completions": texts,
                        "extracted": [e for e, _ in record], "correct": correct,
                        "n_tokens": [c.n_tokens for c in completions], "finish": [c.finish for c in completions]})

    stats = pass_at_1_stats(verdicts)
    lm_res = out["results"][task.task_name]
    lm_mean = 100.0 * float(lm_res[f"{METRIC},{FILTER}"])
    lm_stderr = lm_res.get(f"{METRIC}_stderr,{FILTER}")
    lm_stderr = 100.0 * float(lm_stderr) if isinstance(lm_stderr, (int, float)) else None
    if abs(lm_mean - stats["pass_at_1"]) > 1e-9 or (
            lm_stderr is not None and stats["stderr"] is not None and abs(lm_stderr - stats["stderr"]) > 1e-9):
        raise RuntimeError(f"{name}: lm-eval reports pass@1 {lm_mean} +/- {lm_stderr}, the per-sample verdicts give "
                           f"{stats['pass_at_1']} +/- {stats['stderr']}")

    from qerl.rl.rewards import format_reward

    # strict: the exact <think> ... </think> <answer> ... </answer> shape and a correct answer inside it (the
    # flexible pass@1 above accepts an answer found anywhere the extractor looks: <answer>, \boxed{}, ####)
    strict_verdicts = [[c and format_reward(t) == 1.0 for c, t in zip(s["correct"], s["completions"])]
                       for s in samples]
    strict = pass_at_1_stats(strict_verdicts)
    per_level = {}
    levels = sorted({p.level for p in problems if p.level is not None})
    for level in levels:
        per_level[str(level)] = pass_at_1_stats([v for v, p in zip(verdicts, problems) if p.level == level])
        per_level[str(level)]["pass_at_1_strict"] = pass_at_1_stats(
            [v for v, p in zip(strict_verdicts, problems) if p.level == level])["pass_at_1"]

    tokens = [n for s in samples for n in s["n_tokens"]]
    finishes = [f for s in samples for f in s["finish"]]
    found = [e is not None for s in samples for e in s["extracted"]]
    formatted = [format_reward(t) == 1.0 for s in samples for t in s["completions"]]
    return {
        **stats,
        "pass_at_1_strict": strict["pass_at_1"],
        "stderr_strict": strict["stderr"],
        "per_level": per_level,
        "answer_found_pct": 100.0 * sum(found) / len(found),
        "formatted_pct": 100.0 * sum(formatted) / len(formatted),
        "lm_eval": {"task": task.task_name, "pass_at_1": lm_mean, "stderr": lm_stderr,
                    "metric_key": f"{METRIC},{FILTER}", "version": _version("lm_eval")},
        "completion_tokens_mean": sum(tokens) / len(tokens),
        "truncated_pct": 100.0 * finishes.count("length") / len(finishes),
        "finish_counts": {k: finishes.count(k) for k in ("stop", "eos", "length")},
        "seconds": round(seconds, 2),
        "prompt_example": build_prompt(problems[0].question, tokenizer, instruction),
        "samples": samples,
    }


def _version(dist: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:  # pragma: no cover
        return None


def evaluate_model(model, tokenizer, benchmarks: Iterable[str], cfg: dict, seed: int, limit: int | None = None, *,
                   settings: EvalSettings | None = None, data_root: str | Path | None = None,
                   tiny_test: str | Path | None = None, require_adapter: bool | None = None,
                   model_info: dict | None = None, progress: bool = False) -> dict:
    """Evaluate an in-memory model on several benchmarks; the library entry point (the trainer calls this).

    Args:
        model: any transformers causal LM (quantized or not), or a peft.PeftModel around one.
        tokenizer: its tokenizer (with a chat template).
        benchmarks: names from `qerl.evaluate.tasks.EVAL_BENCHMARKS`.
        cfg: a validated config (`qerl.config.load_config`): the `evaluate` section, data.root, prompt.instruction,
            results_dir (for the tiny test split).
        seed: the run's seed (sampling is seeded from it and the benchmark name).
        limit: first `limit` problems of each benchmark (overrides evaluate.limit).
        settings: evaluation settings (default: from cfg, with `limit` applied).
        data_root: overrides data.root.
        tiny_test: overrides the path of the tiny held-out split.
        require_adapter: True: the model must carry an active adapter; False: skip the check; None: check
            whenever the model is a peft.PeftModel.
        model_info: what was loaded (`qerl.policy.Policy.info`), copied into the results.
        progress: progress bars on stderr.

    Returns:
        {"version", "seed", "scale", "settings", "model", "adapter_check", "benchmarks": {name: {"pass_at_1",
        "stderr", "pass_at_1_strict" and "stderr_strict" (the exact <think>/<answer> shape and a correct answer in
        it; per_level entries carry pass_at_1_strict too), "n_problems", "n_repeats", "per_repeat", "per_level",
        "lm_eval", "completion_tokens_mean",
        "truncated_pct", "finish_counts", "answer_found_pct" (samples with an extractable answer),
        "formatted_pct" (samples in the exact <think>/<answer> format), "seconds", "prompt_example",
        "samples": [per-problem log]}},
        "environment", "seconds"}. Percentages are in %.

    Raises:
        ValueError: unknown benchmark, bad settings or data (naming the key, file or value);
            AdapterNotActiveError when the adapter check fails.
    """
    from peft import PeftModel

    names = check_benchmarks(list(benchmarks))
    settings = settings or EvalSettings.from_config(cfg, limit=limit)
    if limit is not None and settings.limit != limit:
        settings = dataclasses.replace(settings, limit=limit)
    settings.check()
    instruction = cfg.get("prompt", {}).get("instruction", "paper")
    data_root = data_root if data_root is not None else cfg.get("data", {}).get("root")
    tiny_test = tiny_test if tiny_test is not None else tiny_test_path(cfg)
    problems = {n: load_problems(n, data_root=data_root, tiny_test=tiny_test, limit=settings.limit) for n in names}

    start = time.perf_counter()
    was_training = model.training
    model.eval()
    try:
        check = require_adapter if require_adapter is not None else isinstance(model, PeftModel)
        adapter_check = check_adapter_active(model, tokenizer) if check else None
        results = {n: evaluate_benchmark(model, tokenizer, n, problems[n], settings.for_benchmark(n), seed, instruction,
                                         progress) for n in names}
    finally:
        model.train(was_training)
    return {
        "version": RESULTS_VERSION,
        "seed": seed,
        "scale": cfg.get("scale"),
        "settings": {**settings.record(), "benchmarks": names, "methods": list(settings.methods),
                     "instruction": instruction, "stop": "</answer>"},
        "model": model_info or {"class": type(model).__name__},
        "adapter_check": adapter_check,
        "benchmarks": results,
        "environment": {"python": platform.python_version(), "torch": torch.__version__,
                        "transformers": _version("transformers"), "lm_eval": _version("lm_eval"),
                        "math_verify": _version("math-verify"), "peft": _version("peft"),
                        "threads": torch.get_num_threads()},
        "seconds": round(time.perf_counter() - start, 2),
    }


def write_results(results: dict, path: str | Path) -> None:
    """Write the results JSON atomically (temporary file + rename; folders created; qerl.io.write_json), after
    checking that every benchmark entry holds the qerl.contract.records.BenchmarkRecord fields the report reads.

    Raises:
        ValueError: a benchmark entry that breaks the contract (naming the file and the key); nothing is written.
    """
    from qerl.io import write_json

    for name, record in results["benchmarks"].items():
        BenchmarkRecord.parse(record, f"{path}: benchmarks.{name}")
    write_json(path, results, sort_keys=True)


# ---- CLI ---------------------------------------------------------------------------------------------------------
RENAMED = {"--model": "--base"}  # the old spelling still works (qerl.cli.parse_args)


def add_arguments(parser) -> None:
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
    from qerl.config import load_config
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
                          dtype=cfg["model"]["dtype"], device=args.device)
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
