"""What a training run's metrics.jsonl and every eval file hold, as typed records: the trainer and the evaluator
write them, the report reads them, all through these definitions.

Why: the trainer wrote its metrics keys, the report listed the keys it required and guessed which were optional;
the evaluator wrote `pass_at_1` / `n_problems` while the report also accepted `pass@1` / `n`. Now one dataclass
states each file's fields (the field order is the file's key order), the writer builds it, and the reader parses it
with errors that name the file, the line or key, and the value seen.

* metrics.jsonl: one `MetricsRow` per training step (the field docstrings say what each holds). `WALL_CLOCK_FIELDS`
  are the wall-clock times and memory readings: the only fields that differ between two runs of the same seed on
  the same machine.
* rollouts/step<k>.jsonl.gz (qerl.contract.paths.rollout_chunk): one `RolloutSample` per line, the completions of
  training step k that the run kept (config train.rollout_samples); `read_rollouts` reads a run's folder of them.
* eval.json and R/evals/.../seed<k>.json: {"benchmarks": {name: record}, ...}; every record holds at least the
  fields of `BenchmarkRecord` (pass@1 in %, its standard error, the strict pass@1, the problem and repeat counts,
  and per level the `PassAt1` fields); `PassAt1` is the spelling of one pass@1 summary.

No torch import. Run the tests: `pytest tests/test_contract.py -q`.
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

__all__ = ["MetricsRow", "METRIC_FIELDS", "WALL_CLOCK_FIELDS", "read_metrics_rows", "RolloutSample", "read_rollouts",
           "PassAt1", "BenchmarkRecord", "read_json", "json_error"]


@dataclass
class MetricsRow:
    """One training step of metrics.jsonl (means over the step's rollout rows unless said otherwise).

    Attributes:
        step: 0-based training step.
        reward: mean reward; accuracy: fraction of correct answers; entropy: mean per-token entropy of the
            sampling distributions (nats); sigma: the AQN sigma of the rollout (0 without AQN);
            response_length: mean completion tokens.
        loss, clip_fraction, kl, grad_norm, grad_clipped: means over the step's optimizer updates (grad_clipped:
            the fraction of updates whose norm exceeded the clip); mixed_groups: fraction of groups whose rewards
            differ; adv_abs: mean |advantage|.
        time_rollout, time_logprobs, time_update: seconds of the step's phases; peak_memory_bytes: peak memory.
        lr: the learning rate after the step; skipped_updates: updates skipped for a non-finite loss;
        kept_fraction: rows with a loss token after dynamic sampling / overlong filtering; truncated_fraction:
        rows cut by the generation budget; rollout_tokens, rollout_tokens_per_s: tokens sampled and their rate.
        mismatch_kl, is_ratio_mean, is_ratio_max, is_ratio_p99: the rollout-train mismatch (qerl/rl/mismatch.py).
    Floats may be NaN (written as NaN, or null by other writers: read as NaN).
    """

    step: int
    reward: float
    accuracy: float
    entropy: float
    sigma: float
    response_length: float
    loss: float
    clip_fraction: float
    kl: float
    grad_norm: float
    grad_clipped: float
    mixed_groups: float
    adv_abs: float
    time_rollout: float
    time_logprobs: float
    time_update: float
    peak_memory_bytes: int
    lr: float
    skipped_updates: int
    kept_fraction: float
    truncated_fraction: float
    rollout_tokens: int
    rollout_tokens_per_s: float
    mismatch_kl: float
    is_ratio_mean: float
    is_ratio_max: float
    is_ratio_p99: float

    def to_json(self) -> str:
        """The metrics.jsonl line (without its newline): the fields in declaration order."""
        return json.dumps(asdict(self))

    @classmethod
    def parse(cls, obj: Any, where: str) -> "MetricsRow":
        """A row from a parsed JSON object.

        Args:
            obj: the parsed line.
            where: "file:line" for error messages.

        Raises:
            ValueError: not an object, missing or unknown keys, an integer field that is not an integer, a float
                field that is not a number or null.
        """
        if not isinstance(obj, dict):
            raise ValueError(f"{where}: expected a JSON object, got {type(obj).__name__}")
        missing = [k for k in METRIC_FIELDS if k not in obj]
        if missing:
            raise ValueError(f"{where}: missing key(s) {missing}")
        unknown = sorted(set(obj) - set(METRIC_FIELDS))
        if unknown:
            raise ValueError(f"{where}: unknown key(s) {unknown} (qerl.contract.records.MetricsRow lists the fields)")
        values = {}
        for f in fields(cls):
            value = obj[f.name]
            if f.type == "int":
                if isinstance(value, bool) or not isinstance(value, int):
                    raise ValueError(f"{where}: key {f.name!r} must be an integer, got {value!r}")
            elif value is None:
                value = math.nan
            elif isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ValueError(f"{where}: key {f.name!r} must be a number or null, got {value!r}")
            values[f.name] = value
        return cls(**values)


METRIC_FIELDS = tuple(f.name for f in fields(MetricsRow))
#: wall-clock seconds, memory readings and rates from them: the fields two identical runs may differ in.
WALL_CLOCK_FIELDS = ("time_rollout", "time_logprobs", "time_update", "peak_memory_bytes", "rollout_tokens_per_s")


def read_metrics_rows(path: str | Path) -> list[MetricsRow]:
    """Every row of a metrics.jsonl, checked: one JSON object per line, steps strictly increasing.

    Args:
        path: the file.

    Returns:
        The rows in file order (blank lines skipped).

    Raises:
        ValueError: naming `file:line` for a line that is not valid JSON or not a valid row, or whose step does
            not increase; naming the file when it holds no row.
    """
    path = Path(path)
    rows: list[MetricsRow] = []
    with open(path) as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{where}: not valid JSON ({json_error(exc)})") from None
            row = MetricsRow.parse(obj, where)
            if rows and row.step <= rows[-1].step:
                raise ValueError(f"{where}: key 'step' = {row.step} does not increase (previous step {rows[-1].step})")
            rows.append(row)
    if not rows:
        raise ValueError(f"{path}: no metrics lines (expected one JSON object per step)")
    return rows


@dataclass
class RolloutSample:
    """One sampled completion of a training step, as rollouts/step<k>.jsonl.gz holds it (one JSON object a line).

    Attributes:
        step: 0-based training step; prompt_id: the problem's id in its data file; sample: 0-based index of the
            completion among the group_size samples of its prompt; gold: the reference answer.
        completion: the decoded completion (special tokens removed).
        reward: its reward; correct: its answer graded correct; length: completion tokens; truncated: cut by the
            generation budget (max_new_tokens).
        logprob_mean, entropy: mean over the completion's tokens of the sampled token's log-prob and of the
            sampling distribution's entropy (nats), both under the rollout policy (AQN noise, temperature, top-p).
        sigma: the step's AQN sigma (0 without AQN).
    """

    step: int
    prompt_id: str
    sample: int
    gold: str
    completion: str
    reward: float
    correct: bool
    length: int
    truncated: bool
    logprob_mean: float
    entropy: float
    sigma: float

    def to_json(self) -> str:
        """The line (without its newline): the fields in declaration order, non-ASCII text kept as is."""
        return json.dumps(asdict(self), ensure_ascii=False)

    @classmethod
    def parse(cls, obj: Any, where: str) -> "RolloutSample":
        """A sample from a parsed JSON object.

        Raises:
            ValueError: naming `where` and the key: not an object, missing or unknown keys, a value of the wrong type.
        """
        if not isinstance(obj, dict):
            raise ValueError(f"{where}: expected a JSON object, got {type(obj).__name__}")
        names = [f.name for f in fields(cls)]
        missing = [k for k in names if k not in obj]
        unknown = sorted(set(obj) - set(names))
        if missing or unknown:
            raise ValueError(f"{where}: {f'missing key(s) {missing}' if missing else f'unknown key(s) {unknown}'} "
                             f"(qerl.contract.records.RolloutSample lists the fields)")
        kinds = {"int": int, "str": str, "bool": bool, "float": (int, float)}
        for f in fields(cls):
            value = obj[f.name]
            if f.type == "float" and value is None:
                continue
            ok = isinstance(value, kinds[f.type]) and (f.type == "bool" or not isinstance(value, bool))
            if not ok:
                raise ValueError(f"{where}: key {f.name!r} must be {f.type}, got {value!r}")
        return cls(**{k: (math.nan if obj[k] is None else obj[k]) for k in names})


def read_rollouts(folder: str | Path, steps: list[int] | None = None) -> list[RolloutSample]:
    """The rollout samples of a run's rollouts/ folder, in step order (the chunks' own order within a step).

    Args:
        folder: the run's rollouts/ folder (qerl.contract.paths.ROLLOUTS_DIR).
        steps: only these steps (None: every chunk there).

    Raises:
        ValueError: naming `file:line` for a line that is not a valid sample or whose step is not the chunk's.
    """
    import gzip

    from qerl.contract.paths import rollout_chunks

    out: list[RolloutSample] = []
    for step, path in rollout_chunks(folder):
        if steps is not None and step not in steps:
            continue
        with gzip.open(path, "rt", encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):
                where = f"{path}:{lineno}"
                try:
                    sample = RolloutSample.parse(json.loads(line), where)
                except json.JSONDecodeError as exc:
                    raise ValueError(f"{where}: not valid JSON ({json_error(exc)})") from None
                if sample.step != step:
                    raise ValueError(f"{where}: key 'step' = {sample.step}, but the file holds step {step}")
                out.append(sample)
    return out


@dataclass(frozen=True)
class PassAt1:
    """pass@1 over repeats of one benchmark (or of one level of it), as the evaluator writes it.

    Attributes:
        pass_at_1: mean over problems of the fraction of correct samples, in %.
        stderr: standard error of that mean over problems, in % (None for a single problem).
        n_problems: problems; n_repeats: samples per problem.
        per_repeat: accuracy in % of the k-th sample of every problem, k = 1..n_repeats.
    """

    pass_at_1: float
    stderr: float | None
    n_problems: int
    n_repeats: int
    per_repeat: list[float]


def _number(value: Any, where: str, key: str, allow_null: bool) -> float:
    if value is None and allow_null:
        return math.nan
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{where}: key {key!r} must be a number{' or null' if allow_null else ''}, got {value!r}")
    return float(value)


def _percent(value: Any, where: str, key: str) -> float:
    x = _number(value, where, key, allow_null=False)
    if not 0.0 <= x <= 100.0:
        raise ValueError(f"{where}: key {key!r} = {x!r} is not a percentage in [0, 100]")
    return x


def _count(value: Any, where: str, key: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{where}: key {key!r} must be a non-negative integer, got {value!r}")
    return value


@dataclass(frozen=True)
class BenchmarkRecord:
    """What every eval file says about one benchmark (the evaluator writes more: per_repeat, samples, lm_eval, ...).

    Attributes:
        pass_at_1, stderr: the PassAt1 fields of the whole benchmark (stderr NaN when written as null).
        pass_at_1_strict, stderr_strict: the same, counting only completions of the exact <think>/<answer> shape.
        n_problems, n_repeats: problems and samples per problem.
        per_level: level -> pass@1 in % (empty for a benchmark without levels).
    """

    pass_at_1: float
    stderr: float
    pass_at_1_strict: float
    stderr_strict: float
    n_problems: int
    n_repeats: int
    per_level: dict[str, float]

    @classmethod
    def parse(cls, record: Any, where: str) -> "BenchmarkRecord":
        """The record of one benchmark (an entry of an eval file's "benchmarks").

        Args:
            record: the parsed mapping.
            where: "<file>: benchmarks.<name>" for error messages.

        Raises:
            ValueError: naming `where` and the key: a missing key, a value of the wrong type, a percentage outside
                [0, 100], a per_level entry without pass_at_1.
        """
        if not isinstance(record, dict):
            raise ValueError(f"{where}: expected a mapping with the BenchmarkRecord fields, got {record!r}")
        missing = [f.name for f in fields(cls) if f.name not in record]
        if missing:
            raise ValueError(f"{where}: missing key(s) {missing}; present: {sorted(record)}")
        levels = record["per_level"]
        if not isinstance(levels, dict):
            raise ValueError(f"{where}: key 'per_level' must be a mapping level -> PassAt1 fields, got {levels!r}")
        per_level = {}
        for level, entry in levels.items():
            if not isinstance(entry, dict) or "pass_at_1" not in entry:
                raise ValueError(f"{where}: key 'per_level.{level}' must be a mapping with pass_at_1, got {entry!r}")
            per_level[str(level)] = _percent(entry["pass_at_1"], where, f"per_level.{level}.pass_at_1")
        return cls(pass_at_1=_percent(record["pass_at_1"], where, "pass_at_1"),
                   stderr=_number(record["stderr"], where, "stderr", allow_null=True),
                   pass_at_1_strict=_percent(record["pass_at_1_strict"], where, "pass_at_1_strict"),
                   stderr_strict=_number(record["stderr_strict"], where, "stderr_strict", allow_null=True),
                   n_problems=_count(record["n_problems"], where, "n_problems"),
                   n_repeats=_count(record["n_repeats"], where, "n_repeats"),
                   per_level=per_level)


def read_json(path: str | Path) -> Any:
    """A JSON file, parsed.

    Raises:
        ValueError: naming `file:line` when it is not valid JSON.
    """
    try:
        with open(path) as f:
            return json.load(f)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}:{exc.lineno}: not valid JSON ({json_error(exc)})") from None


def json_error(exc: json.JSONDecodeError) -> str:
    """The decoder's message with its column, readable: "Invalid control character at column 155".

    Why: some of json's messages end in "at" because the decoder itself appends ": line L column C (char N)";
    wrapping `exc.msg` as "<msg> at column C" read "Invalid control character at at column 155".
    """
    msg = exc.msg[:-3] if exc.msg.endswith(" at") else exc.msg
    return f"{msg} at column {exc.colno}"
