"""Readers for everything the renderers consume, with the file contracts they rely on, and seed statistics.

Why: the training, evaluation and profiling stages write files; the report stage reads them. This module is the one
place that states what those files must hold and fails with `file:line` / `file: key` when they do not, so a broken
run is caught at rendering time with a message that says where, never drawn as a wrong curve.

Contracts (R = <results_dir>/<scale>; model = config model.name; tasks, variants: see qerl/report/registry.py):

* R/runs/<task>/<model>/<method>/<variant>/seed<k>/metrics.jsonl -- one JSON object per optimizer step, steps
  strictly increasing, each with at least the keys of METRIC_KEYS: step (int), reward, accuracy, entropy, sigma
  (AQN sigma of that step's rollout, 0 without AQN), response_length (mean tokens), clip_fraction, kl, grad_norm,
  time_rollout, time_logprobs, time_update (seconds), peak_memory_bytes. Values are numbers or null (null = not
  defined for this run, e.g. kl under DAPO; read as NaN). Optional: rollout_tokens (tokens generated in the step's
  rollout; Table 9 uses it for our throughput). Other keys are ignored.
* R/runs/.../seed<k>/eval.json -- {"benchmarks": {"<name>": {"pass@1": float (percent, 0-100), "stderr": float or
  null (optional), "n": int, "per_level": {"1": float, ...} (optional)}}, "config": {...}, "provenance": {...}}.
  The evaluation stage's spellings are accepted too: "pass_at_1" for "pass@1", "n_problems" for "n", and per_level
  values that are records ({"pass_at_1": float, ...}) rather than numbers. Other keys are ignored.
* R/evals/<model>/<method>/<benchmark>/seed<k>.json -- the untrained model in a format (bf16, nf4, mxfp4, nvfp4):
  either the per-benchmark record itself ({"pass@1", "stderr", "n", "per_level"?, "provenance"?}) or the eval.json
  layout above with <benchmark> among its "benchmarks".
* provenance (optional): the "provenance" mapping of either eval layout, or of the trainer's run.json beside a
  run's files (qerl/provenance.py writes it); "commit" and "hardware" (a string, or a mapping whose "gpu" or else
  "cpu" is used) are printed in the artifact's header line.
* <results_dir>/measured/<gpu>/rollout.csv (model,method,rank,batch,tokens_per_s), e2e.csv
  (model,method,batch,gradient_checkpointing,step_s) where step_s is seconds or "OOM", memory.csv
  (model,method,model_size_gb,peak_gb, optionally batch,gradient_checkpointing: the step whose peak it is), and
  optionally provenance.json (gpu, driver, torch, commit, date, command).
  model is a name such as "Qwen2.5-7B-Instruct" or "7B" (its "<N>B" part matches the paper's rows); method is a name
  of qerl/methods.py (lora, qlora, qerl or nvfp4_lora, ...); gradient_checkpointing is true/false/1/0/yes/no.

Seed statistics: `summarize` gives the mean and the sample standard deviation (ddof = 1) over the seeds; with one
seed the std is None and tables print the mean alone.

Run the tests: `pytest tests/report -q`.
"""
from __future__ import annotations

import csv
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "METRIC_KEYS",
    "Stat",
    "summarize",
    "read_metrics",
    "read_eval",
    "read_untrained_eval",
    "read_run_provenance",
    "BenchResult",
    "read_rollout_csv",
    "read_e2e_csv",
    "read_memory_csv",
    "read_measured_provenance",
    "paper_model_label",
]

METRIC_KEYS = (
    "step", "reward", "accuracy", "entropy", "sigma", "response_length", "clip_fraction", "kl", "grad_norm",
    "time_rollout", "time_logprobs", "time_update", "peak_memory_bytes",
)
OPTIONAL_METRIC_KEYS = ("rollout_tokens", "mismatch_kl", "is_ratio_mean", "is_ratio_max", "is_ratio_p99")
PASS_KEYS = ("pass@1", "pass_at_1")  # the brief's spelling, and the evaluation stage's (qerl/evaluate/run.py)
N_KEYS = ("n", "n_problems")


@dataclass(frozen=True)
class Stat:
    """Mean and spread of one quantity over seeds (or a single paper value: n = 0, std None)."""

    mean: float
    std: float | None
    n: int


def summarize(values: list[float]) -> Stat:
    """Mean and sample std (ddof = 1) of per-seed values; NaNs are dropped.

    Args:
        values: one value per seed.

    Returns:
        Stat(mean, std or None when fewer than two finite values, n = number of finite values); mean NaN if none.
    """
    finite = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    n = len(finite)
    if n == 0:
        return Stat(float("nan"), None, 0)
    mean = sum(finite) / n
    std = math.sqrt(sum((v - mean) ** 2 for v in finite) / (n - 1)) if n > 1 else None
    return Stat(mean, std, n)


def _number(value: Any, where: str, key: str, allow_null: bool = True) -> float:
    if value is None and allow_null:
        return float("nan")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{where}: key {key!r} must be a number{' or null' if allow_null else ''}, got {value!r}")
    return float(value)


def read_metrics(path: str | Path) -> dict[str, list[float]]:
    """Read a run's metrics.jsonl into columns.

    Args:
        path: the metrics.jsonl file.

    Returns:
        {key: [value per step]} for METRIC_KEYS and the optional keys present on every line; null becomes NaN.

    Raises:
        ValueError: naming `file:line` for a line that is not a JSON object, lacks a required key, holds a non-number,
            or whose step does not increase; naming the file when it holds no step at all.
    """
    path = Path(path)
    columns: dict[str, list[float]] = {k: [] for k in METRIC_KEYS + OPTIONAL_METRIC_KEYS}
    optional_seen = {k: True for k in OPTIONAL_METRIC_KEYS}
    last_step = None
    with open(path) as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{where}: not valid JSON ({exc.msg})") from None
            if not isinstance(row, dict):
                raise ValueError(f"{where}: expected a JSON object, got {type(row).__name__}")
            missing = [k for k in METRIC_KEYS if k not in row]
            if missing:
                raise ValueError(f"{where}: missing key(s) {missing}")
            step = row["step"]
            if isinstance(step, bool) or not isinstance(step, int):
                raise ValueError(f"{where}: key 'step' must be an integer, got {step!r}")
            if last_step is not None and step <= last_step:
                raise ValueError(f"{where}: key 'step' = {step} does not increase (previous step {last_step})")
            last_step = step
            for k in METRIC_KEYS:
                columns[k].append(_number(row[k], where, k, allow_null=k != "step"))
            for k in OPTIONAL_METRIC_KEYS:
                if k in row and optional_seen[k]:
                    columns[k].append(_number(row[k], where, k))
                else:
                    optional_seen[k] = False
    if last_step is None:
        raise ValueError(f"{path}: no metrics lines (expected one JSON object per step)")
    for k in OPTIONAL_METRIC_KEYS:
        if not optional_seen[k]:
            del columns[k]
    return columns


@dataclass(frozen=True)
class BenchResult:
    """One benchmark's result in one eval file."""

    pass1: float
    stderr: float
    n: int
    per_level: dict[str, float]
    strict: float = float("nan")  # pass@1 of the exact <think>/<answer> shape with a correct answer (NaN if absent)


def _first_key(record: dict, names: tuple[str, ...]) -> str | None:
    return next((k for k in names if k in record), None)


def _bench(record: Any, where: str) -> BenchResult:
    if not isinstance(record, dict):
        raise ValueError(f"{where}: expected a mapping with pass@1 and n, got {record!r}")
    p_key, n_key = _first_key(record, PASS_KEYS), _first_key(record, N_KEYS)
    if p_key is None or n_key is None:
        raise ValueError(f"{where}: missing key {'pass@1' if p_key is None else 'n'!r} "
                         f"(accepted: {PASS_KEYS if p_key is None else N_KEYS}); present: {sorted(record)}")
    pass1 = _number(record[p_key], where, p_key, allow_null=False)
    if not 0.0 <= pass1 <= 100.0:
        raise ValueError(f"{where}: key {p_key!r} = {pass1!r} is not a percentage in [0, 100]")
    stderr = _number(record.get("stderr"), where, "stderr")
    n = record[n_key]
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ValueError(f"{where}: key {n_key!r} must be a non-negative integer, got {n!r}")
    levels = record.get("per_level") or {}
    if not isinstance(levels, dict):
        raise ValueError(f"{where}: key 'per_level' must be a mapping level -> pass@1, got {levels!r}")
    per_level = {}
    for k, v in levels.items():
        if isinstance(v, dict):  # the evaluation stage's layout: level -> {"pass_at_1": ..., ...}
            key = _first_key(v, PASS_KEYS)
            if key is None:
                raise ValueError(f"{where}: key 'per_level.{k}' has no pass@1 (accepted: {PASS_KEYS})")
            v = v[key]
        per_level[str(k)] = _number(v, where, f"per_level.{k}", allow_null=False)
    strict = _number(record.get("pass_at_1_strict"), where, "pass_at_1_strict")
    return BenchResult(pass1, stderr, n, per_level, strict)


def _load_json(path: Path) -> Any:
    try:
        with open(path) as f:
            return json.load(f)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}:{exc.lineno}: not valid JSON ({exc.msg})") from None


def _provenance(obj: dict, path: Path) -> dict:
    prov = obj.get("provenance") or {}
    if not isinstance(prov, dict):
        raise ValueError(f"{path}: key 'provenance' must be a mapping, got {prov!r}")
    return prov


def read_eval(path: str | Path) -> tuple[dict[str, BenchResult], dict]:
    """Read a trained run's eval.json.

    Args:
        path: the eval.json file.

    Returns:
        ({benchmark: BenchResult}, provenance mapping (empty when absent)).

    Raises:
        ValueError: naming the file and key for bad JSON, a missing "benchmarks" mapping or a bad benchmark record.
    """
    path = Path(path)
    obj = _load_json(path)
    if not isinstance(obj, dict) or not isinstance(obj.get("benchmarks"), dict):
        raise ValueError(f"{path}: expected a JSON object with a 'benchmarks' mapping")
    results = {name: _bench(rec, f"{path}: benchmarks.{name}") for name, rec in obj["benchmarks"].items()}
    return results, _provenance(obj, path)


def read_run_provenance(path: str | Path) -> dict:
    """The "provenance" mapping of a run's run.json (written by the trainer beside metrics.jsonl); {} if none.

    Raises:
        ValueError: naming the file when it is not valid JSON or its provenance is not a mapping.
    """
    path = Path(path)
    obj = _load_json(path)
    return _provenance(obj, path) if isinstance(obj, dict) else {}


def read_untrained_eval(path: str | Path, benchmark: str) -> tuple[BenchResult, dict]:
    """Read an untrained evaluation file (R/evals/<model>/<method>/<benchmark>/seed<k>.json).

    Args:
        path: the JSON file.
        benchmark: the benchmark this file is for (used when the file has the eval.json layout).

    Returns:
        (BenchResult, provenance mapping).

    Raises:
        ValueError: naming the file and key for bad JSON or a bad record.
    """
    path = Path(path)
    obj = _load_json(path)
    if not isinstance(obj, dict):
        raise ValueError(f"{path}: expected a JSON object, got {type(obj).__name__}")
    if "benchmarks" in obj:
        results, prov = read_eval(path)
        if benchmark not in results:
            raise ValueError(f"{path}: key 'benchmarks.{benchmark}' is missing; present: {sorted(results)}")
        return results[benchmark], prov
    return _bench(obj, str(path)), _provenance(obj, path)


_MODEL_SIZE = re.compile(r"(?<![\w.])(\d+(?:\.\d+)?)[bB](?![A-Za-z0-9])")


def paper_model_label(name: str) -> str:
    """The paper's row label of a model name: "Qwen2.5-7B-Instruct" -> "7B"; a name without "<N>B" is returned as is.

    Args:
        name: a model name from a config or a measured CSV.

    Returns:
        "<N>B" when the name has exactly such a size token, else `name` unchanged ("tiny", "smollm2-135m").
    """
    found = _MODEL_SIZE.findall(name.replace("_", "-"))
    return f"{found[0]}B" if len(found) == 1 else name


def _read_csv(path: Path, columns: tuple[str, ...], optional: tuple[str, ...] = ()) -> list[tuple[str, dict[str, str]]]:
    """(file:line, {column: text}) per non-empty row; `columns` must be in the header, `optional` ones read as ""
    when absent."""
    columns = columns + optional
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        header = reader.fieldnames or []
        missing = [c for c in columns if c not in header and c not in optional]
        if missing:
            raise ValueError(f"{path}:1: missing column(s) {missing}; header is {header}")
        rows = []
        for lineno, row in enumerate(reader, 2):
            if not any((v or "").strip() for v in row.values()):
                continue
            rows.append((f"{path}:{lineno}", {k: (row.get(k) or "").strip() for k in columns}))
    return rows


def _csv_float(value: str, where: str, key: str) -> float:
    try:
        return float(value)
    except ValueError:
        raise ValueError(f"{where}: column {key!r} must be a number, got {value!r}") from None


def _csv_int(value: str, where: str, key: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"{where}: column {key!r} must be an integer, got {value!r}") from None


def read_rollout_csv(path: str | Path) -> list[dict]:
    """Read measured/<gpu>/rollout.csv.

    Returns:
        Rows {"model" (paper label), "model_name", "method", "rank", "batch", "tokens_per_s"}.

    Raises:
        ValueError: naming `file:line` and the column for a missing column or a value that is not a number.
    """
    out = []
    for where, r in _read_csv(Path(path), ("model", "method", "rank", "batch", "tokens_per_s")):
        out.append({"model": paper_model_label(r["model"]), "model_name": r["model"], "method": r["method"],
                    "rank": _csv_int(r["rank"], where, "rank"), "batch": _csv_int(r["batch"], where, "batch"),
                    "tokens_per_s": _csv_float(r["tokens_per_s"], where, "tokens_per_s")})
    return out


_BOOL = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}


def _csv_bool(value: str, where: str) -> bool:
    if value.lower() not in _BOOL:
        raise ValueError(f"{where}: column 'gradient_checkpointing' must be true/false, got {value!r}")
    return _BOOL[value.lower()]


def read_e2e_csv(path: str | Path) -> list[dict]:
    """Read measured/<gpu>/e2e.csv.

    Returns:
        Rows {"model", "model_name", "method", "batch", "gc" (bool), "step_s" (float, or the string "OOM")}.

    Raises:
        ValueError: naming `file:line` and the column for a bad value.
    """
    out = []
    cols = ("model", "method", "batch", "gradient_checkpointing", "step_s")
    for where, r in _read_csv(Path(path), cols):
        gc = _csv_bool(r["gradient_checkpointing"], where)
        step = "OOM" if r["step_s"].upper() == "OOM" else _csv_float(r["step_s"], where, "step_s")
        out.append({"model": paper_model_label(r["model"]), "model_name": r["model"], "method": r["method"],
                    "batch": _csv_int(r["batch"], where, "batch"), "gc": gc, "step_s": step})
    return out


def read_memory_csv(path: str | Path) -> list[dict]:
    """Read measured/<gpu>/memory.csv.

    Returns:
        Rows {"model", "model_name", "method", "model_size_gb", "peak_gb" (float or "OOM"), "batch" and
        "gradient_checkpointing" (of the step whose peak it is; None when the file has no such column)}.

    Raises:
        ValueError: naming `file:line` and the column for a bad value.
    """
    out = []
    for where, r in _read_csv(Path(path), ("model", "method", "model_size_gb", "peak_gb"),
                              optional=("batch", "gradient_checkpointing")):
        peak = "OOM" if r["peak_gb"].upper() == "OOM" else _csv_float(r["peak_gb"], where, "peak_gb")
        batch = _csv_int(r["batch"], where, "batch") if r["batch"] else None
        gc = _csv_bool(r["gradient_checkpointing"], where) if r["gradient_checkpointing"] else None
        out.append({"model": paper_model_label(r["model"]), "model_name": r["model"], "method": r["method"],
                    "model_size_gb": _csv_float(r["model_size_gb"], where, "model_size_gb"), "peak_gb": peak,
                    "batch": batch, "gradient_checkpointing": gc})
    return out


def read_measured_provenance(folder: str | Path) -> dict:
    """measured/<gpu>/provenance.json as a mapping ({} when absent).

    Raises:
        ValueError: naming the file when it is not a JSON object.
    """
    path = Path(folder) / "provenance.json"
    if not path.exists():
        return {}
    obj = _load_json(path)
    if not isinstance(obj, dict):
        raise ValueError(f"{path}: expected a JSON object, got {type(obj).__name__}")
    return obj
