"""Load and validate a harness config against workflow/schemas/config.schema.yaml.

The Snakefile and every `qerl` subcommand validate through the same schema, so an unknown key, a wrong type, an
unknown method or a missing data file fails at once with the key and the value seen, before any compute is spent.

Run: `qerl check-config --config config/config.yaml` prints the config with every default filled in.
"""
from __future__ import annotations

import copy
import difflib
import re
from pathlib import Path
from typing import Any

import jsonschema
import yaml

__all__ = ["ConfigError", "SCHEMA_PATH", "REPO_ROOT", "load_schema", "validate_config", "load_config", "get",
           "gpu_jobs_at_once"]

REPO_ROOT = Path(__file__).resolve().parents[1]
SCHEMA_PATH = REPO_ROOT / "workflow" / "schemas" / "config.schema.yaml"


class ConfigError(ValueError):
    """A config that does not match the schema or names something that does not exist."""


def load_schema() -> dict:
    with open(SCHEMA_PATH) as f:
        return yaml.safe_load(f)


def _fill_defaults(schema: dict, node: Any) -> Any:
    """Fill schema defaults into `node` (recursively, objects only); returns the filled node."""
    if schema.get("type") != "object" or not isinstance(node, dict):
        return node
    for key, sub in schema.get("properties", {}).items():
        if key not in node and "default" in sub:
            node[key] = copy.deepcopy(sub["default"])
        if key in node:
            node[key] = _fill_defaults(sub, node[key])
    return node


_EXPONENT_WITHOUT_POINT = re.compile(r"[-+]?\d+[eE][-+]?\d+")


def _number_hint(value: str) -> str:
    """Why YAML made `value` a string where a number belongs, and how to write it (or "" when it does not look
    like a number). YAML 1.1, which PyYAML and Snakemake read, takes 4e-4 (no decimal point) for text."""
    if _EXPONENT_WITHOUT_POINT.fullmatch(value.strip()):
        fixed = re.sub(r"^([-+]?\d+)", r"\1.0", value.strip())
        return f"; YAML reads an exponent without a decimal point ({value}) as text: write {fixed}"
    try:
        float(value)
    except ValueError:
        return ""
    return "; it is quoted text: write the number without quotes"


def _enum_text(value, allowed: list) -> str:
    """What `value` is not, the allowed values, and where a method name of the wrong kind belongs (or the closest
    allowed value)."""
    from qerl.contract.methods import TRAINED_METHODS, UNTRAINED_METHODS

    if set(allowed) == set(TRAINED_METHODS):
        text = f"not a trainable method; allowed: {allowed}"
        if value in UNTRAINED_METHODS:
            return text + (f"; {value!r} is a weight format evaluated without training: list it under "
                           "evaluate.methods (the untrained rows of Tables 1/2)")
    elif set(allowed) == set(UNTRAINED_METHODS):
        text = f"not an untrained weight format; allowed: {allowed}"
        if value in TRAINED_METHODS:
            return text + (f"; {value!r} is a trained method: list it under train.methods, and its training job "
                           "evaluates it")
    else:
        text = f"not one of {allowed}"
    close = difflib.get_close_matches(str(value), [str(a) for a in allowed], n=1)
    return text + (f" (did you mean {close[0]!r}?)" if close else "")


def _describe(error: jsonschema.ValidationError) -> str:
    where = ".".join(str(p) for p in error.absolute_path) or "<top level>"
    if error.validator == "additionalProperties":
        allowed = sorted(error.schema.get("properties", {}))
        extra = sorted(set(error.instance) - set(allowed))
        return f"unknown key(s) {extra} under '{where}'; allowed: {allowed}"
    if error.validator == "enum":
        text = _enum_text(error.instance, list(error.validator_value))
        if "propertyNames" in error.schema_path:  # a mapping's key (train.lr_by_method) names the value
            return f"key '{where}': {error.instance!r} (a key of it) is {text}"
        return f"key '{where}': value {error.instance!r} is {text}"
    if error.validator == "type":
        expected = error.validator_value if isinstance(error.validator_value, list) else [error.validator_value]
        hint = _number_hint(error.instance) if "number" in expected and isinstance(error.instance, str) else ""
        return f"key '{where}': value {error.instance!r} should be of type {error.validator_value}{hint}"
    return f"key '{where}': value {error.instance!r}: {error.message}"


def validate_config(config: dict, source: str = "<config>", check_data: bool = True) -> dict:
    """Validate `config` and return a copy with every default filled in.

    Args:
        config: the parsed YAML mapping.
        source: file name used in error messages.
        check_data: also require the benchmark files named by data.benchmarks to exist (unless data.download
            is true, in which case the `data` rule will fetch them).

    Raises:
        ConfigError: naming the key and the value seen.
    """
    if not isinstance(config, dict):
        raise ConfigError(f"{source}: the config must be a mapping, got {type(config).__name__}")
    schema = load_schema()
    validator = jsonschema.Draft202012Validator(schema)
    errors = sorted(validator.iter_errors(config), key=lambda e: list(map(str, e.absolute_path)))
    if errors:
        lines = "\n  ".join(_describe(e) for e in errors)
        raise ConfigError(f"{source}: invalid config:\n  {lines}")
    cfg = _fill_defaults(schema, copy.deepcopy(config))
    _check_semantics(cfg, source, check_data)
    return cfg


def _check_semantics(cfg: dict, source: str, check_data: bool) -> None:
    # Method names: the schema's enums (trainable methods for train.*, untrained formats for evaluate.methods) have
    # already named a wrong one; what is left are the relations between keys.
    train = cfg.get("train", {})
    ablations = train.get("ablations", {})
    task = ablations.get("task")
    if task is not None and task not in train.get("tasks", {}):
        raise ConfigError(f"{source}: key 'train.ablations.task': unknown task {task!r}; "
                          f"train.tasks defines {sorted(train.get('tasks', {}))}")
    for tname, t in train.get("tasks", {}).items():
        extra = [m for m in t.get("methods", []) if m not in train.get("methods", [])]
        if extra:
            raise ConfigError(f"{source}: key 'train.tasks.{tname}.methods': {extra} not in train.methods "
                              f"{train.get('methods', [])}; a task trains a subset of train.methods")
    evaluated = [b for b in cfg["evaluate"]["benchmarks"] if b != "tiny"]
    absent = [b for b in evaluated if b not in cfg["data"]["benchmarks"]]
    if absent:
        raise ConfigError(f"{source}: key 'evaluate.benchmarks' names {absent}, which 'data.benchmarks' "
                          f"({cfg['data']['benchmarks']}) does not provide; add them there")
    if check_data and cfg["data"]["benchmarks"] and not cfg["data"]["download"]:
        from qerl.contract.paths import missing_files

        missing = missing_files(cfg["data"]["root"], cfg["data"]["benchmarks"])
        if missing:
            raise ConfigError(
                f"{source}: key 'data.root' = {cfg['data']['root']!r}: missing data file(s) {missing} "
                "(and data.download is false); put the JSONL files there or set data.download: true"
            )


def load_config(path: str | Path, overrides: dict | None = None, check_data: bool = True) -> dict:
    """Read a YAML config, apply `overrides` (a nested mapping merged on top), validate, fill defaults."""
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"config file {str(path)!r} does not exist")
    try:
        with open(path) as f:
            config = yaml.safe_load(f) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from exc
    if overrides:
        config = _merge(config, overrides)
    return validate_config(config, source=str(path), check_data=check_data)


def _merge(base: dict, top: dict) -> dict:
    out = copy.deepcopy(base)
    for key, value in top.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def get(cfg: dict, dotted: str) -> Any:
    """`get(cfg, "tiny_model.pretrain.lr")`: a nested value, with a clear error naming the missing key."""
    node: Any = cfg
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            raise ConfigError(f"config key {dotted!r} is missing (stopped at {part!r})")
        node = node[part]
    return node


def gpu_jobs_at_once(path: str | Path) -> int:
    """How many GPU jobs may run at once under the config at `path`: resources.train.gpus x jobs_per_gpu (1 x ... on
    a CPU config). `make small` and workflow/run_device.sh pass it to Snakemake as `--resources gpu=N`, so Snakemake's
    priorities, not the GPU slot locks (qerl/rl/distributed.py), decide which GPU job starts first."""
    train = load_config(path, check_data=False)["resources"]["train"]
    return max(1, train["gpus"]) * train["jobs_per_gpu"]
