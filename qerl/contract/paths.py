"""The path grammar of results/ and of the data root: where every stage writes and every later stage reads.

Why one module: the Snakemake rules (workflow/rules/*.smk: targets, inputs, outputs), the trainer, the evaluator and
the report name the same files; when each spelled the paths itself they could drift apart. Every function returns a
plain string built by one f-string, so a Snakemake wildcard passes through unchanged:
`run_dir(R, "{task}", "{model}", "{method}", "{variant}", "{seed}")` is the train rule's output pattern.

Results (R = <results_dir>/<scale>, `results_root`):
    R/config.yaml                                      the effective config every job reads
    R/data/tiny/{pretrain,rl,test}.jsonl               generated arithmetic problems (tiny scale)
    R/data/manifest.json                               real benchmark files checked/downloaded (rule data)
    R/models/<model>/base/                             the base checkpoint
    R/quantized/<model>/<format>/                      NVFP4 / MXFP4 (AWQ-calibrated) and NF4 checkpoints
    R/quantized/<model>/awq_scales/<format>.safetensors
    R/runs/<task>/<model>/<method>/<variant>/seed<k>/  one training run: metrics.jsonl, eval.json, run.json,
                                                       checkpoint.pt, adapter/ (LoRA) or model/ (full),
                                                       rollouts/step<k>.jsonl.gz, tensorboard/ (train.report_to)
    R/trackio/                                         Trackio's database of every run of the scale (train.report_to)
    R/logs/train/<task>/<model>/<method>/<variant>/seed<k>.log   a training job's log (stderr)
    R/samples.html                                     completions per method at the first and last step
    R/evals/<model>/<format>/<benchmark>/seed<k>.json  an untrained format on one benchmark
    R/tables/<id>.{md,tex,csv,html}, R/figures/<id>.{png,pdf}, R/claims.{md,html}
    R/measured/<gpu>/                                  what the profile rule measured on this machine
    <results_dir>/measured/<gpu>/                      committed GPU measurements (what the tables read)
Data root (config data.root): <root>/<benchmark>/<split>.jsonl (BENCHMARK_FILES).

No torch import: the Snakefile reads this at parse time. Run the tests: `pytest tests/test_contract.py -q`.
"""
from __future__ import annotations

import re
from pathlib import Path

__all__ = [
    "METRICS_FILE", "EVAL_FILE", "RUN_INFO_FILE", "CHECKPOINT_FILE", "ADAPTER_DIR", "FULL_MODEL_DIR", "TINY_SPLITS",
    "ROLLOUTS_DIR", "TENSORBOARD_DIR", "trackio_dir", "rollout_chunk", "rollout_chunks", "run_name", "train_log",
    "GROUP_RUNS_NAME", "train_group_log",
    "samples_page",
    "results_root", "root_of", "config_file", "tiny_split", "data_manifest", "base_model_dir", "pretrained_model_dir",
    "quantized_dir",
    "awq_scales_file", "run_dir", "eval_file", "artifact_file", "claims_file", "measured_dir",
    "BENCHMARK_FILES", "HELD_OUT", "benchmark_splits", "missing_files", "task_benchmarks",
]

METRICS_FILE = "metrics.jsonl"  # one MetricsRow per step (qerl.contract.records)
EVAL_FILE = "eval.json"  # the run's evaluation (benchmarks: BenchmarkRecord each)
RUN_INFO_FILE = "run.json"  # the run's settings and provenance
CHECKPOINT_FILE = "checkpoint.pt"  # resumable state (deliberately not a Snakemake output)
ADAPTER_DIR = "adapter"  # the trained LoRA adapter (peft's save_pretrained)
FULL_MODEL_DIR = "model"  # the fully fine-tuned model (method full)
ROLLOUTS_DIR = "rollouts"  # per-step chunks of rollout samples (rollout_chunk; deliberately not a Snakemake output)
TENSORBOARD_DIR = "tensorboard"  # a run's TensorBoard event files (train.report_to: [tensorboard])
TINY_SPLITS = ("pretrain", "rl", "test")
_CHUNK = re.compile(r"step(\d+)\.jsonl\.gz")


def results_root(results_dir: str, scale: str) -> str:
    """R = <results_dir>/<scale>."""
    return f"{results_dir}/{scale}"


def root_of(cfg: dict) -> str:
    """R of a validated config (its results_dir and scale)."""
    return results_root(cfg["results_dir"], cfg["scale"])


def config_file(root: str) -> str:
    """R/config.yaml: the effective config (config file + overrides, defaults filled in)."""
    return f"{root}/config.yaml"


def tiny_split(root: str, split: str) -> str:
    """R/data/tiny/<split>.jsonl, split one of TINY_SPLITS.

    Raises:
        ValueError: an unknown split.
    """
    if split not in TINY_SPLITS and "{" not in split:
        raise ValueError(f"unknown tiny data split {split!r}; known: {list(TINY_SPLITS)}")
    return f"{root}/data/tiny/{split}.jsonl"


def data_manifest(root: str) -> str:
    """R/data/manifest.json: the real benchmark files the data rule checked or downloaded."""
    return f"{root}/data/manifest.json"


def base_model_dir(root: str, model: str) -> str:
    """R/models/<model>/base: the base checkpoint folder."""
    return f"{root}/models/{model}/base"


def pretrained_model_dir(root: str, model: str) -> str:
    """R/models/<model>/pretrained: the converted model before the SFT warm-up (only when sft.steps > 0)."""
    return f"{root}/models/{model}/pretrained"


def quantized_dir(root: str, model: str, fmt: str) -> str:
    """R/quantized/<model>/<fmt>: the quantized checkpoint (nvfp4, mxfp4) or NF4 recipe (nf4)."""
    return f"{root}/quantized/{model}/{fmt}"


def awq_scales_file(root: str, model: str, fmt: str) -> str:
    """R/quantized/<model>/awq_scales/<fmt>.safetensors: AWQ per-channel scales of one format."""
    return f"{root}/quantized/{model}/awq_scales/{fmt}.safetensors"


def run_dir(root: str, task: str, model: str, method: str, variant: str, seed: int | str) -> str:
    """R/runs/<task>/<model>/<method>/<variant>/seed<k>: one training run's folder."""
    return f"{root}/runs/{task}/{model}/{method}/{variant}/seed{seed}"


def run_name(task: str, model: str, method: str, variant: str, seed: int | str) -> str:
    """<task>/<model>/<method>/<variant>/seed<k>: a run's name in trackers and tables (its folder under R/runs)."""
    return f"{task}/{model}/{method}/{variant}/seed{seed}"


def rollout_chunk(run: str | Path, step: int) -> str:
    """<run>/rollouts/step<k>.jsonl.gz (k zero-padded to 6 digits): the kept rollout samples of one step."""
    return f"{run}/{ROLLOUTS_DIR}/step{step:06d}.jsonl.gz"


def rollout_chunks(folder: str | Path) -> list[tuple[int, Path]]:
    """(step, path) of every chunk in a rollouts/ folder, by step; [] when the folder does not exist."""
    found = [(int(m.group(1)), p) for p in Path(folder).glob("step*.jsonl.gz") if (m := _CHUNK.fullmatch(p.name))]
    return sorted(found)


def trackio_dir(root: str) -> str:
    """R/trackio: Trackio's local database (TRACKIO_DIR), one project per scale, one run per run folder."""
    return f"{root}/trackio"


def train_log(root: str, task: str, model: str, method: str, variant: str, seed: int | str) -> str:
    """R/logs/train/<task>/<model>/<method>/<variant>/seed<k>.log: the training job's log."""
    return f"{root}/logs/train/{task}/{model}/{method}/{variant}/seed{seed}.log"


# the file name (no suffix) of a grouped training job's log and benchmark (resources.train.group_runs), beside the
# <variant>/ folders of its runs' own logs
GROUP_RUNS_NAME = "all-runs"


def train_group_log(root: str, task: str, model: str, method: str) -> str:
    """R/logs/train/<task>/<model>/<method>/all-runs.log: the log of the job that trains every run of a (task, method)
    (resources.train.group_runs)."""
    return f"{root}/logs/train/{task}/{model}/{method}/{GROUP_RUNS_NAME}.log"


def samples_page(root: str) -> str:
    """R/samples.html: a few completions per method at the first and last kept step (the report's samples page)."""
    return f"{root}/samples.html"


def eval_file(root: str, model: str, method: str, benchmark: str, seed: int | str) -> str:
    """R/evals/<model>/<method>/<benchmark>/seed<k>.json: an untrained weight format on one benchmark."""
    return f"{root}/evals/{model}/{method}/{benchmark}/seed{seed}.json"


def artifact_file(root: str, kind: str, artifact_id: str, ext: str) -> str:
    """R/tables/<id>.<ext> (kind "table") or R/figures/<id>.<ext> (kind "figure").

    Raises:
        ValueError: a kind other than table / figure.
    """
    if kind not in ("table", "figure"):
        raise ValueError(f"unknown artifact kind {kind!r}; expected 'table' or 'figure'")
    return f"{root}/{kind}s/{artifact_id}.{ext}"


def claims_file(root: str, ext: str) -> str:
    """R/claims.<ext> (md or html)."""
    return f"{root}/claims.{ext}"


def measured_dir(results: str, gpu: str) -> str:
    """<results>/measured/<gpu>: a profiling run's CSVs (results = R for the profile rule's own output,
    <results_dir> for the committed measurements the tables read)."""
    return f"{results}/measured/{gpu}"


# ---- the data root ---------------------------------------------------------------------------------------------
#: benchmark name -> split -> path relative to the data root.
BENCHMARK_FILES: dict[str, dict[str, str]] = {
    "gsm8k": {"train": "gsm8k/train.jsonl", "test": "gsm8k/test.jsonl"},
    "math500": {"test": "math500/test.jsonl"},
    "aime24": {"test": "aime24/test.jsonl"},
    "aime25": {"test": "aime25/test.jsonl"},
    "amc23": {"test": "amc23/test.jsonl"},
    "math_train": {"train": "math_train/train.jsonl"},
}

#: Benchmarks a model trained on a source is evaluated on when its task names none (the trainer and the report).
HELD_OUT: dict[str, list[str]] = {"tiny": ["tiny"], "gsm8k": ["gsm8k"],
                                  "math_train": ["math500", "aime24", "aime25", "amc23"]}


def task_benchmarks(task: dict) -> list[str]:
    """What a run of a task is evaluated on (the benchmarks of its eval.json): the task's eval_benchmarks, else the
    held-out split of its source.

    Args:
        task: one entry of config train.tasks (a validated mapping with at least `source`).
    """
    return list(task.get("eval_benchmarks") or HELD_OUT[task["source"]])


def benchmark_splits(name: str) -> dict[str, str]:
    """{split: path relative to the data root} of one benchmark.

    Raises:
        ValueError: an unknown benchmark, naming the known ones.
    """
    if name not in BENCHMARK_FILES:
        raise ValueError(f"unknown benchmark {name!r}; known benchmarks: {sorted(BENCHMARK_FILES)}")
    return BENCHMARK_FILES[name]


def missing_files(root: str | Path, names: list[str]) -> list[str]:
    """The files (relative to `root`, every split) that the benchmarks `names` need and that do not exist.

    Args:
        root: the data root.
        names: benchmark names.

    Returns:
        Relative paths such as ``gsm8k/train.jsonl``, in the order of `names` and their splits.

    Raises:
        ValueError: for an unknown benchmark name.
    """
    root = Path(root)
    missing = []
    for name in names:
        for rel in benchmark_splits(name).values():
            if not (root / rel).is_file() and rel not in missing:
                missing.append(rel)
    return missing
