"""`qerl` command line: one thin subcommand per DAG stage; the library does the work.

Each subcommand lives in its own module as `add_arguments(parser)` + `run(args)`, imported only when called, so
`qerl --help` stays fast and a stage's heavy imports (torch, transformers) are paid only by that stage. Every
subcommand that takes `--config` validates it against workflow/schemas/config.schema.yaml first.
"""
from __future__ import annotations

import argparse
import importlib
import sys

__all__ = ["SUBCOMMANDS", "main"]

# name -> (module, one-line help). Add a stage by adding one line here.
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "check-config": ("qerl.commands.check_config", "validate a config file and print it with defaults filled in"),
    "config-docs": ("qerl.commands.config_docs", "write config/README.md from the config schema"),
    "data": ("qerl.data.fetch", "make sure the benchmark files exist (download from the hub when missing and online)"),
    "gen-tiny": ("qerl.data.tiny", "generate the tiny scale's arithmetic word problems"),
    "pretrain-tiny": ("qerl.models.pretrain", "build the tiny tokenizer and Qwen2 model and pretrain it"),
    "train": ("qerl.rl.trainer", "RL-train one run (task, method, variant, seed) with GRPO or DAPO"),
    "grade-check": ("qerl.evaluate.grade_check", "grader self-check: gold answers must grade 100, shuffled about 0"),
    "render": ("qerl.report.render", "render one paper table or figure (or all) beside the paper's numbers"),
    "claims": ("qerl.report.claims", "check the paper's headline claims against this scale's results (Markdown)"),
    "evaluate": ("qerl.evaluate.run", "pass@1 of a model (any weight format, optional LoRA adapter) through lm-eval"),
    "prepare-model": ("qerl.models.prepare", "convert the small scale's GGUF model into a transformers checkpoint"),
    "calibrate": ("qerl.quantize.calibrate_cmd", "search AWQ per-channel scales of a base model for NVFP4 or MXFP4"),
    "profile": ("qerl.profiling.run", "rollout tokens/s, GRPO step time and memory at the paper's shapes (GPU)"),
    "quantize": ("qerl.quantize.quantize_cmd", "write a quantized checkpoint (NVFP4/MXFP4/NF4) and its layer errors"),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="qerl", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (_, help_) in SUBCOMMANDS.items():
        sub.add_parser(name, help=help_, add_help=False)
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        parser.print_help()
        return 0
    name = argv[0]
    if name not in SUBCOMMANDS:
        parser.error(f"unknown command {name!r}; choose from {', '.join(SUBCOMMANDS)}")
    module = importlib.import_module(SUBCOMMANDS[name][0])
    cmd_parser = argparse.ArgumentParser(prog=f"qerl {name}", description=SUBCOMMANDS[name][1])
    module.add_arguments(cmd_parser)
    args = cmd_parser.parse_args(argv[1:])
    try:
        return int(module.run(args) or 0)
    except ValueError as exc:  # bad config or data: one clear line, no traceback
        print(f"qerl {name}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
