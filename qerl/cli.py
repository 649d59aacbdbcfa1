"""`qerl` command line: one thin subcommand per DAG stage; the library does the work.

Each subcommand lives in its own module as `add_arguments(parser)` + `run(args)`, imported only when called, so
`qerl --help` stays fast and a stage's heavy imports (torch, transformers) are paid only by that stage. Every
subcommand that takes `--config` validates it against workflow/schemas/config.schema.yaml first.

One name per concept across subcommands (README "CLI"): `--config FILE`, `--base DIR` (the base model checkpoint),
`--out PATH` (the file or folder written), `--data-root DIR`, and lists space-separated (`--benchmarks gsm8k
math500`, `add_list`). A module may define `RENAMED = {old: new}`: an old spelling still works and prints one note
on stderr (`parse_args`); the comma form of a list does the same.
"""
from __future__ import annotations

import argparse
import importlib
import sys

__all__ = ["SUBCOMMANDS", "ListAction", "add_list", "parse_args", "main"]

# name -> (module, one-line help). Add a stage by adding one line here.
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "check-config": ("qerl.commands.check_config", "validate a config file and print it with defaults filled in"),
    "config-docs": ("qerl.commands.config_docs", "write config/README.md from the config schema"),
    "data": ("qerl.data.fetch", "make sure the benchmark files exist (download from the hub when missing and online)"),
    "gen-tiny": ("qerl.data.tiny", "generate the tiny scale's arithmetic word problems"),
    "pretrain-tiny": ("qerl.models.pretrain", "build the tiny tokenizer and Qwen2 model and pretrain it"),
    "sft": ("qerl.models.sft", "supervised warm-up of the base model on a training split's answer format (small scale)"),
    "train": ("qerl.commands.train",
              "RL-train one run (task, method, variant, seed) with GRPO or DAPO, then evaluate it"),
    "grade-check": ("qerl.evaluate.grade_check", "grader self-check: gold answers must grade 100, shuffled about 0"),
    "render": ("qerl.report.render", "render one paper table or figure (or all) beside the paper's numbers"),
    "claims": ("qerl.report.claims", "check the paper's headline claims against this scale's results (Markdown)"),
    "evaluate": ("qerl.evaluate.run", "pass@1 of a model (any weight format, optional LoRA adapter) through lm-eval"),
    "prepare-model": ("qerl.models.prepare", "the base checkpoint of the small and paper scales (GGUF conversion, hub or local model, random weights)"),
    "calibrate": ("qerl.quantize.calibrate_cmd", "search AWQ per-channel scales of a base model for NVFP4 or MXFP4"),
    "profile": ("qerl.profiling.run", "rollout tokens/s, GRPO step time and memory at the paper's shapes (GPU)"),
    "quantize": ("qerl.quantize.quantize_cmd", "write a quantized checkpoint (NVFP4/MXFP4/NF4) and its layer errors"),
    "samples": ("qerl.commands.samples", "write the report's samples page: completions per method at the first and "
                                         "last kept step, and each reward figure's rollout files"),
    "status": ("qerl.commands.status", "where every training run of a config stands: steps, reward, pass@1, state"),
}


class ListAction(argparse.Action):
    """Store a space-separated list (`--archs 7B 3B`), each item converted by `item_type`.

    The comma form of earlier versions (`--archs 7B,3B`, and `""` for none) is split the same way, with a note on
    stderr, so recorded commands (results/measured/*/provenance) still run.
    """

    def __init__(self, option_strings, dest, item_type=str, **kwargs):
        super().__init__(option_strings, dest, **kwargs)
        self.item_type = item_type

    def __call__(self, parser, namespace, values, option_string=None):
        if any("," in v for v in values):
            print(f"{parser.prog}: note: {option_string} takes space-separated values ({option_string} "
                  f"{' '.join(x for v in values for x in v.split(',') if x)}); the comma form still works",
                  file=sys.stderr)
        items = [x.strip() for v in values for x in v.split(",") if x.strip()]
        try:
            setattr(namespace, self.dest, [self.item_type(x) for x in items])
        except ValueError as exc:
            parser.error(f"argument {option_string}: {exc}")


def add_list(parser: argparse.ArgumentParser, flag: str, *, item_type=str, empty: bool = False, **kwargs) -> None:
    """Add a space-separated list option (`nargs="+"`, or `"*"` when `empty` allows `--flag` alone for none)."""
    parser.add_argument(flag, nargs="*" if empty else "+", action=ListAction, item_type=item_type, **kwargs)


def parse_args(parser: argparse.ArgumentParser, argv: list[str], renamed: dict[str, str] | None = None):
    """`parser.parse_args(argv)` after replacing the old spellings in `renamed` ({old: new}), one note each."""
    args = []
    for i, arg in enumerate(argv):
        if arg == "--":
            args += argv[i:]
            break
        name, eq, value = arg.partition("=")
        if renamed and name in renamed:
            print(f"{parser.prog}: note: {name} is now {renamed[name]}; the old name still works", file=sys.stderr)
            arg = renamed[name] + eq + value
        args.append(arg)
    return parser.parse_args(args)


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
    args = parse_args(cmd_parser, argv[1:], getattr(module, "RENAMED", None))
    try:
        return int(module.run(args) or 0)
    except ValueError as exc:  # bad config or data: one clear line, no traceback
        print(f"qerl {name}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
