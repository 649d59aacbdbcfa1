"""Readers for everything the renderers consume, and seed statistics.

Why: the training, evaluation and profiling stages write files; the report stage reads them, and fails with
`file:line` / `file: key` when they do not hold what they must, so a broken run is caught at rendering time with a
message that says where, never drawn as a wrong curve.

Contracts (R = <results_dir>/<scale>; paths: qerl/contract/paths.py):

* R/runs/<task>/<model>/<method>/<variant>/seed<k>/metrics.jsonl -- one qerl.contract.records.MetricsRow per step
  (every field, steps strictly increasing); the trainer writes exactly these rows. Read into columns of floats
  (null and NaN as NaN).
* R/runs/.../seed<k>/eval.json and R/evals/<model>/<method>/<benchmark>/seed<k>.json -- {"benchmarks": {"<name>":
  record}, "provenance"?: {...}, ...}: every record holds the fields of qerl.contract.records.BenchmarkRecord
  (pass_at_1, stderr, pass_at_1_strict, stderr_strict, n_problems, n_repeats, per_level); the evaluator writes them
  (and checks them before it does). Other keys are the evaluator's own (samples, environment, ...).
* provenance (optional): the "provenance" mapping of an eval file, or of the trainer's run.json beside a run's files
  (qerl/provenance.py writes it); "commit" and "hardware" (a string, or a mapping whose "gpu" or else "cpu" is used)
  are printed in the artifact's header line.
* <results_dir>/measured/<gpu>/rollout.csv (model,method,rank,batch,tokens_per_s), e2e.csv
  (model,method,batch,gradient_checkpointing,step_s) where step_s is seconds or "OOM", memory.csv
  (model,method,model_size_gb,peak_gb, optionally batch,gradient_checkpointing: the step whose peak it is), and
  optionally provenance.json (gpu, driver, torch, commit, date, command); `qerl profile` writes them, earlier runs
  were committed without memory.csv's last two columns.
  model is a name such as "Qwen2.5-7B-Instruct" or "7B" (its "<N>B" part matches the paper's rows); method is a name
  of qerl/contract/methods.py (lora, qlora, qerl or nvfp4_lora, ...); gradient_checkpointing is
  true/false/1/0/yes/no.

Seed statistics: `summarize` gives the mean and the sample standard deviation (ddof = 1) over the seeds; with one
seed the std is None and tables print the mean alone.

Run the tests: `pytest tests/report -q`.
"""
from __future__ import annotations

import csv
import math
import re
from dataclasses import astuple, dataclass, fields
from pathlib import Path

from qerl.contract.measured import E2E, MEMORY, ROLLOUT
from qerl.contract.records import BenchmarkRecord, MetricsRow, read_json, read_metrics_rows

__all__ = [
    "Stat",
    "summarize",
    "read_metrics",
    "read_eval",
    "read_untrained_eval",
    "read_run_provenance",
    "read_rollout_csv",
    "read_e2e_csv",
    "read_memory_csv",
    "read_measured_provenance",
    "paper_model_label",
]


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


def read_metrics(path: str | Path) -> dict[str, list[float]]:
    """Read a run's metrics.jsonl into columns.

    Args:
        path: the metrics.jsonl file.

    Returns:
        {field: [value per step]} for every MetricsRow field, as floats (null and NaN read as NaN).

    Raises:
        ValueError: naming `file:line` for a line that is not valid JSON or not a valid MetricsRow, or whose step
            does not increase; naming the file when it holds no step at all.
    """
    rows = read_metrics_rows(path)
    names = [f.name for f in fields(MetricsRow)]
    return {name: [float(v) for v in column] for name, column in zip(names, zip(*(astuple(r) for r in rows)))}


def _provenance(obj: dict, path: Path) -> dict:
    prov = obj.get("provenance") or {}
    if not isinstance(prov, dict):
        raise ValueError(f"{path}: key 'provenance' must be a mapping, got {prov!r}")
    return prov


def read_eval(path: str | Path) -> tuple[dict[str, BenchmarkRecord], dict]:
    """Read an eval file (a trained run's eval.json, or an untrained evaluation).

    Args:
        path: the JSON file.

    Returns:
        ({benchmark: BenchmarkRecord}, provenance mapping (empty when absent)).

    Raises:
        ValueError: naming the file and key for bad JSON, a missing "benchmarks" mapping or a bad benchmark record.
    """
    path = Path(path)
    obj = read_json(path)
    if not isinstance(obj, dict) or not isinstance(obj.get("benchmarks"), dict):
        raise ValueError(f"{path}: expected a JSON object with a 'benchmarks' mapping")
    results = {name: BenchmarkRecord.parse(rec, f"{path}: benchmarks.{name}")
               for name, rec in obj["benchmarks"].items()}
    return results, _provenance(obj, path)


def read_run_provenance(path: str | Path) -> dict:
    """The "provenance" mapping of a run's run.json (written by the trainer beside metrics.jsonl); {} if none.

    Raises:
        ValueError: naming the file when it is not valid JSON or its provenance is not a mapping.
    """
    path = Path(path)
    obj = read_json(path)
    return _provenance(obj, path) if isinstance(obj, dict) else {}


def read_untrained_eval(path: str | Path, benchmark: str) -> tuple[BenchmarkRecord, dict]:
    """Read an untrained evaluation file (R/evals/<model>/<method>/<benchmark>/seed<k>.json) for its benchmark.

    Args:
        path: the JSON file (the eval file layout, `read_eval`).
        benchmark: the benchmark this file is for.

    Returns:
        (BenchmarkRecord, provenance mapping).

    Raises:
        ValueError: naming the file and key for bad JSON, a bad record, or a file without that benchmark.
    """
    results, prov = read_eval(path)
    if benchmark not in results:
        raise ValueError(f"{path}: key 'benchmarks.{benchmark}' is missing; present: {sorted(results)}")
    return results[benchmark], prov


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
        Rows {"model" (paper label), "model_name", "method", "rank", "batch", "tokens_per_s" (float, or the string
        "OOM" where the rollout ran out of memory)}, one per (model, method, rank, batch): where the profiler wrote
        both timings of a configuration (column "timing": "buckets", the graph-replay timing every batch has, and
        "full", one complete generation that validates it within ~1 %), the "buckets" row, so that every table,
        figure and claim reads the same number; without the column, the first row of a configuration.

    Raises:
        ValueError: naming `file:line` and the column for a missing column or a value that is not a number.
    """
    out: dict[tuple, dict] = {}
    timing: dict[tuple, str] = {}  # the timing of the row kept for each configuration
    for where, r in _read_csv(Path(path), ROLLOUT.required, ("timing",)):
        tps = r["tokens_per_s"]
        row = {"model": paper_model_label(r["model"]), "model_name": r["model"], "method": r["method"],
               "rank": _csv_int(r["rank"], where, "rank"), "batch": _csv_int(r["batch"], where, "batch"),
               "tokens_per_s": "OOM" if tps.upper() == "OOM" else _csv_float(tps, where, "tokens_per_s")}
        key = (r["model"], row["method"], row["rank"], row["batch"])
        if key not in out or (r["timing"] == "buckets" and timing[key] != "buckets"):
            out[key], timing[key] = row, r["timing"]
    return list(out.values())


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
    for where, r in _read_csv(Path(path), E2E.required):
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
    for where, r in _read_csv(Path(path), MEMORY.required, optional=MEMORY.optional):
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
    obj = read_json(path)
    if not isinstance(obj, dict):
        raise ValueError(f"{path}: expected a JSON object, got {type(obj).__name__}")
    return obj
