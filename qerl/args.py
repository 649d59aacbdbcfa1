"""argparse helpers shared by the `qerl` subcommands (qerl/commands) and the `python -m` developer tools.

One name per concept across commands (README "CLI"): lists are space-separated (`--benchmarks gsm8k math500`,
`add_list`); a command module may define `RENAMED = {old: new}`, and `parse_args` still accepts an old spelling with
one note on stderr; the comma form of a list does the same. Here, below every stage, so that a library module with a
developer `main` never imports the CLI (qerl/cli.py) to parse its arguments.
"""
from __future__ import annotations

import argparse
import sys

__all__ = ["ListAction", "add_list", "parse_args"]


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
