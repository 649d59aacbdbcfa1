"""`qerl config-docs`: write config/README.md from the schema, so the documentation of every key cannot drift.

Run: `qerl config-docs --out config/README.md` (tests/test_config_docs.py fails when the file is stale).
"""
from __future__ import annotations

import json

from qerl.config import SCHEMA_PATH, load_schema
from qerl.io import write_text

HEADER = """# Configuration

Three configs ship with the harness: `config.yaml` (tiny scale, the default), `small.yaml` and `paper.yaml`, and a
fourth for one GPU: `paper_random.yaml`, the paper scale's every rule once at real size per sequence with random
weights of Qwen2.5-7B's architecture (`model.source: random`; 2 training steps per method, 32 GSM8K problems per
format; its header lists what is cut and why `full` is left out). Its accuracies mean nothing: it measures each
stage's time and peak memory. Run one with `snakemake --cores all --configfile config/<name>.yaml`. Every config
is validated against `workflow/schemas/config.schema.yaml` by the Snakefile and by every `qerl` subcommand; an
unknown key, a wrong type or an unknown method fails before any job starts, naming the key and the value seen.
`qerl check-config --config FILE` prints a config with every default filled in.

This page is generated from the schema by `qerl config-docs --out config/README.md`; edit the schema, not this page.

| key | type | default | description |
|---|---|---|---|
"""


def _type(node: dict) -> str:
    t = node.get("type", "")
    if "enum" in node:
        return " \\| ".join(str(v) for v in node["enum"])
    if isinstance(t, list):
        return " or ".join(t)
    if t == "array" and "items" in node:
        return f"list of {_type(node['items'])}"
    return t


def _rows(node: dict, prefix: str = ""):
    for key, sub in node.get("properties", {}).items():
        name = f"{prefix}{key}"
        default = json.dumps(sub["default"]) if "default" in sub else ""
        if sub.get("type") == "object" and "properties" in sub:
            default = ""
        desc = " ".join(str(sub.get("description", "")).split()).replace("|", "\\|")
        yield f"| `{name}` | {_type(sub)} | `{default}` | {desc} |" if default else f"| `{name}` | {_type(sub)} | | {desc} |"
        yield from _rows(sub, f"{name}.")
        extra = sub.get("additionalProperties")
        if isinstance(extra, dict) and "properties" in extra:
            yield from _rows(extra, f"{name}.<name>.")


def render() -> str:
    """The Markdown documentation of every key of the schema."""
    return HEADER + "\n".join(_rows(load_schema())) + "\n"


def add_arguments(parser) -> None:
    parser.add_argument("--out", default=str(SCHEMA_PATH.parents[2] / "config" / "README.md"), help="output file")


def run(args) -> int:
    write_text(args.out, render())
    return 0
