"""lm-eval tasks generated in code for our local benchmark files: the paper's prompt, sampling, repeats, math-verify.

Why generated tasks and not lm-eval's own gsm8k/minerva_math: those read the hub, use few-shot prompts and their own
answer regexes. QeRL evaluates zero-shot with its <think>/<answer> instruction (App. E) at T=0.6, top-p 0.95, and
averages pass@1 over repeats; we also want the grading to be exactly the training reward's (`qerl.rl.rewards`:
answer extraction, then math-verify), so a pass@1 in a table and a reward in a curve mean the same thing.

How: `load_problems` reads a benchmark through the validated loaders (`qerl.data.benchmarks`: real benchmarks from
``data.root``; ``tiny``: the generated held-out split, with levels), `write_docs` writes them as a normalized JSONL
(doc_index, id, question, answer, level), and `build_task` makes an lm-eval `ConfigurableTask` reading that file
through the `datasets` "json" builder (no hub: HF_HUB_OFFLINE / HF_DATASETS_OFFLINE are set, the builder's cache
goes to a folder the caller owns):
- doc_to_text = `qerl.data.prompts.build_prompt(question, tokenizer, instruction)`, i.e. the model's chat template
  applied once, here; lm-eval is run with apply_chat_template=False and no few-shot, so it adds nothing around it
  (`qerl.evaluate.run` checks every request's context against the prompt it expects);
- generate_until with until ["</answer>"], do_sample, temperature, top_p, max_gen_toks from the config;
- repeats = n, and the `take_first_k` filter with k = n: lm-eval's default filter for generate_until is
  `take_first`, which would silently grade only the first of the n samples;
- process_results = `Grader.process_results`: every sample graded with `is_correct(extract_answer(text), gold)`;
  the metric pass_at_1 of a problem is the mean over its n samples; lm-eval aggregates it with "mean" and reports
  the standard error of that mean over problems (sample std / sqrt(n problems)). The Grader keeps each sample's
  extracted answer and verdict for the per-sample log.

Names: gsm8k, math500, aime24, aime25, amc23 (``<data.root>/<name>/test.jsonl``) and ``tiny``
(``<results_dir>/tiny/data/tiny/test.jsonl``, levels 1-5 reported separately).

Run the tests: ``pytest tests/evaluate/test_tasks.py -q``.
"""
from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from qerl.data.benchmarks import Problem, load_benchmark, load_jsonl_problems

__all__ = [
    "EVAL_BENCHMARKS",
    "STOP",
    "METRIC",
    "FILTER",
    "EvalSettings",
    "check_benchmarks",
    "tiny_test_path",
    "load_problems",
    "write_docs",
    "Grader",
    "build_task_config",
    "build_task",
]

#: benchmarks the evaluator knows (math_train is a training set, not an evaluation set).
EVAL_BENCHMARKS = ("gsm8k", "math500", "aime24", "aime25", "amc23", "tiny")
#: the stop string: generation ends after the answer tag closes (the string is kept in the completion).
STOP = "</answer>"
METRIC = "pass_at_1"
FILTER = "all_repeats"


@dataclass(frozen=True)
class EvalSettings:
    """The `evaluate` config section (workflow/schemas/config.schema.yaml documents each key).

    Attributes:
        benchmarks: names from EVAL_BENCHMARKS.
        methods: the untrained methods (weight formats) the DAG evaluates.
        n_repeats: samples per problem; pass@1 is their mean accuracy.
        temperature: sampling temperature (0 = greedy).
        top_p: nucleus sampling mass.
        max_new_tokens: generation limit per sample.
        limit: evaluate only the first `limit` problems of each benchmark (None: all).
        batch_size: sequences per forward batch.
        repeats: benchmark -> samples per problem where it differs from n_repeats (AIME/AMC have 30/40 problems
            and need more samples than GSM8K's 1319); see `for_benchmark`.
    """

    benchmarks: tuple[str, ...] = ("gsm8k",)
    methods: tuple[str, ...] = ("bf16", "nf4", "mxfp4", "nvfp4")
    n_repeats: int = 4
    temperature: float = 0.6
    top_p: float = 0.95
    max_new_tokens: int = 4096
    limit: int | None = None
    batch_size: int = 32
    repeats: dict = field(default_factory=dict)

    def for_benchmark(self, name: str) -> "EvalSettings":
        """These settings with n_repeats taken from `repeats` where it names the benchmark."""
        return replace(self, n_repeats=self.repeats[name]) if name in self.repeats else self

    def record(self) -> dict:
        """The settings as results files record them (an empty `repeats` is left out, as before it existed)."""
        out = asdict(self)
        if not out["repeats"]:
            del out["repeats"]
        return out

    @classmethod
    def from_config(cls, cfg: dict, **overrides: Any) -> "EvalSettings":
        """Settings from a validated config (`qerl.config.load_config`), with keyword overrides (None = keep).

        Raises:
            ValueError: a bad benchmark name or a non-positive count (naming the key and the value).
        """
        section = dict(cfg.get("evaluate", {}))
        section.update({k: v for k, v in overrides.items() if v is not None})
        known = {f for f in cls.__dataclass_fields__}
        unknown = sorted(set(section) - known)
        if unknown:
            raise ValueError(f"config key 'evaluate': unknown key(s) {unknown}; known: {sorted(known)}")
        for key in ("benchmarks", "methods"):
            if key in section:
                section[key] = tuple(section[key])
        settings = cls(**section)
        settings.check()
        return settings

    def check(self) -> None:
        """Raises ValueError naming the `evaluate.<key>` that is out of range."""
        check_benchmarks(self.benchmarks)
        for key in ("n_repeats", "max_new_tokens", "batch_size"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"config key 'evaluate.{key}': expected a positive integer, got {value!r}")
        if not isinstance(self.repeats, dict):
            raise ValueError(f"config key 'evaluate.repeats': expected a mapping benchmark -> samples, got "
                             f"{self.repeats!r}")
        for name, value in self.repeats.items():
            check_benchmarks([name])
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"config key 'evaluate.repeats.{name}': expected a positive integer, got {value!r}")
        bad_limit = isinstance(self.limit, bool) or not isinstance(self.limit, int) or self.limit < 1
        if self.limit is not None and bad_limit:
            raise ValueError(f"config key 'evaluate.limit': expected a positive integer or null, got {self.limit!r}")
        if not self.temperature >= 0:
            raise ValueError(f"config key 'evaluate.temperature': expected >= 0, got {self.temperature!r}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"config key 'evaluate.top_p': expected a value in (0, 1], got {self.top_p!r}")


def check_benchmarks(names) -> list[str]:
    """The names as a list, each checked against EVAL_BENCHMARKS.

    Raises:
        ValueError: naming the unknown benchmark(s) and the known ones, or an empty list.
    """
    names = [names] if isinstance(names, str) else list(names)
    if not names:
        raise ValueError(f"no benchmark given; known benchmarks: {list(EVAL_BENCHMARKS)}")
    bad = [n for n in names if n not in EVAL_BENCHMARKS]
    if bad:
        raise ValueError(f"unknown benchmark(s) {bad}; known benchmarks: {list(EVAL_BENCHMARKS)}")
    return names


def tiny_test_path(cfg: dict) -> Path:
    """Where the `gen_tiny` rule writes the tiny scale's held-out problems: R/data/tiny/test.jsonl
    (qerl.contract.paths)."""
    from qerl.contract.paths import root_of, tiny_split

    return Path(tiny_split(root_of(cfg), "test"))


def load_problems(name: str, *, data_root: str | Path | None = None, tiny_test: str | Path | None = None,
                  limit: int | None = None) -> list[Problem]:
    """The problems of one evaluation benchmark, validated, in file order.

    Args:
        name: one of EVAL_BENCHMARKS.
        data_root: folder of the real benchmarks (``data.root``); needed unless name == "tiny".
        tiny_test: the tiny held-out JSONL; needed when name == "tiny".
        limit: keep the first `limit` problems.

    Returns:
        The problems.

    Raises:
        ValueError: unknown name, a missing path argument or file, or a bad row (``file:line``, field, value).
    """
    check_benchmarks([name])
    if name == "tiny":
        if tiny_test is None:
            raise ValueError("benchmark 'tiny' needs the path of the generated test split (tiny_test)")
        problems = load_jsonl_problems(tiny_test, source="tiny", limit=limit)
    else:
        if data_root is None:
            raise ValueError(f"benchmark {name!r} needs data_root (config key 'data.root')")
        problems = load_benchmark(name, data_root, limit=limit)
    if not problems:
        raise ValueError(f"benchmark {name!r}: no problems to evaluate (limit={limit!r})")
    return problems


def write_docs(problems: list[Problem], path: str | Path) -> Path:
    """Write the problems as the task's JSONL: doc_index, id, question, answer (str), level (int or null).

    Args:
        problems: from `load_problems`.
        path: the file to write (its folder is created).

    Returns:
        The path.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for i, p in enumerate(problems):
            f.write(json.dumps({"doc_index": i, "id": p.id, "question": p.question, "answer": str(p.answer),
                                "level": p.level}, ensure_ascii=False) + "\n")
    return path


@dataclass
class Grader:
    """lm-eval's process_results for our tasks, keeping every sample's verdict for the per-sample log.

    Attributes:
        timeout_s: math-verify timeout per sample (see `qerl.rl.rewards.is_correct`).
        records: doc_index -> list of (extracted answer, correct), one per repeat, in lm-eval's response order.
    """

    timeout_s: int | None = 3
    records: dict[int, list[tuple[str | None, bool]]] = field(default_factory=dict)

    def process_results(self, doc: dict, results: list) -> dict[str, float]:
        """Grade the n samples of one problem; returns {"pass_at_1": fraction correct}.

        Args:
            doc: the task doc (doc_index, answer, ...).
            results: lm-eval's filtered responses: one entry per request, here [[text_1, ..., text_n]].

        Raises:
            ValueError: if the responses are not one list of strings (a filter or repeats misconfiguration).
        """
        from qerl.rl.rewards import extract_answer, is_correct

        if len(results) != 1 or not isinstance(results[0], (list, tuple)):
            raise ValueError(f"process_results: expected [[sample, ...]] for doc {doc.get('id')!r}, "
                             f"got {str(results)[:200]}")
        graded = []
        for text in results[0]:
            pred = extract_answer(text)
            graded.append((pred, bool(is_correct(pred, doc["answer"], timeout_s=self.timeout_s))))
        self.records[int(doc["doc_index"])] = graded
        return {METRIC: sum(c for _, c in graded) / len(graded)}


def build_task_config(name: str, docs_file: str | Path, tokenizer: Any, settings: EvalSettings, grader: Grader,
                      instruction: str = "paper", cache_dir: str | Path | None = None) -> dict:
    """The lm-eval TaskConfig (as a dict) of one benchmark.

    Args:
        name: benchmark name (the task is called ``qerl_<name>``).
        docs_file: the JSONL written by `write_docs`.
        tokenizer: the evaluated model's tokenizer (its chat template renders the prompt).
        settings: sampling, repeats and generation length.
        grader: receives every problem's samples.
        instruction: ``prompt.instruction`` (``paper`` or ``none``).
        cache_dir: the `datasets` cache for the json builder (None: the library default).

    Returns:
        The config dict (callables for doc_to_text and process_results).
    """
    from qerl.data.prompts import build_prompt

    def doc_to_text(doc: dict) -> str:
        return build_prompt(doc["question"], tokenizer, instruction)

    dataset_kwargs: dict[str, Any] = {"data_files": {"test": str(Path(docs_file).resolve())}}
    if cache_dir is not None:
        dataset_kwargs["cache_dir"] = str(cache_dir)
    n = settings.n_repeats
    return {
        "task": f"qerl_{name}",
        "dataset_path": "json",
        "dataset_kwargs": dataset_kwargs,
        "test_split": "test",
        "output_type": "generate_until",
        "doc_to_text": doc_to_text,
        "doc_to_target": "answer",
        "description": "",
        "target_delimiter": "",
        "num_fewshot": 0,
        "generation_kwargs": {
            "until": [STOP],
            "do_sample": settings.temperature > 0,
            "temperature": settings.temperature,
            "top_p": settings.top_p,
            "max_gen_toks": settings.max_new_tokens,
        },
        "repeats": n,
        "filter_list": [{"name": FILTER, "filter": [{"function": "take_first_k", "k": n}]}],
        "process_results": grader.process_results,
        "metric_list": [{"metric": METRIC, "aggregation": "mean", "higher_is_better": True}],
        "metadata": {"version": 1.0},
    }


def build_task(name: str, docs_file: str | Path, tokenizer: Any, settings: EvalSettings, grader: Grader,
               instruction: str = "paper", cache_dir: str | Path | None = None):
    """`lm_eval.api.task.ConfigurableTask` of one benchmark (see `build_task_config`), read offline.

    Returns:
        The task, its docs loaded.
    """
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    from lm_eval.api.task import ConfigurableTask

    config = build_task_config(name, docs_file, tokenizer, settings, grader, instruction, cache_dir)
    task = ConfigurableTask(config=config)
    task.set_config(key="num_fewshot", value=0)
    return task
