"""The `qerl` command line: one name per concept across subcommands, space-separated lists, and the old spellings
(recorded in committed provenance) still accepted with one note on stderr."""
from __future__ import annotations

import argparse
import importlib

import pytest

from qerl.args import ListAction, add_list, parse_args
from qerl.cli import SUBCOMMANDS, module_name

# Spellings replaced by one name per concept (README, "CLI"); none may come back as an option of any subcommand.
OLD = {"--model": "--base", "--model-dir": "--base", "--out-dir": "--out", "--output": "--out",
       "--benchmark": "--benchmarks", "--data": "--calib", "--timeout": "--timeout-s"}
LISTS = {"--benchmarks", "--archs", "--methods", "--ranks", "--batches", "--full-batches", "--e2e-batches",
         "--hf-batches"}


def _parser(name: str) -> tuple[argparse.ArgumentParser, object]:
    module = importlib.import_module(module_name(name))
    parser = argparse.ArgumentParser(prog=f"qerl {name}")
    module.add_arguments(parser)
    return parser, module


@pytest.mark.parametrize("name", list(SUBCOMMANDS))
def test_one_name_per_concept(name):
    parser, module = _parser(name)
    options = {s: a for a in parser._actions for s in a.option_strings}
    renamed = getattr(module, "RENAMED", {})
    for old, new in renamed.items():
        assert old not in options and new in options, (old, new)
        assert OLD.get(old) == new, f"{old} -> {new} is not in the README's table"
    for old in set(OLD) - set(renamed):
        # --data names the tiny data folder (pretrain-tiny, train); only calibrate/quantize called a file that
        assert old not in options or old == "--data" and name in ("pretrain-tiny", "train"), old
    for flag in LISTS & set(options):
        assert isinstance(options[flag], ListAction), f"qerl {name} {flag} is not a space-separated list"


def test_old_spellings_still_work_with_a_note(capsys):
    parser, module = _parser("grade-check")
    args = parse_args(parser, ["--benchmark", "aime25", "--data-root", "d", "--output=r.json"], module.RENAMED)
    assert args.benchmarks == ["aime25"] and args.out == "r.json"
    err = capsys.readouterr().err
    assert "--benchmark is now --benchmarks" in err and "--output is now --out" in err
    parser, module = _parser("evaluate")
    args = parse_args(parser, ["--model", "m", "--benchmarks", "gsm8k,math500"], module.RENAMED)
    assert args.base == "m" and args.benchmarks == ["gsm8k", "math500"]
    assert "--benchmarks takes space-separated values (--benchmarks gsm8k math500)" in capsys.readouterr().err


def test_new_spellings_print_nothing(capsys):
    parser, module = _parser("profile")
    args = parse_args(parser, ["--archs", "7B", "3B", "--batches", "1", "8", "--e2e-batches", "--out", "w"],
                      module.RENAMED if hasattr(module, "RENAMED") else None)
    assert (args.archs, args.batches, args.e2e_batches, args.ranks) == (["7B", "3B"], [1, 8], [], [16, 32, 64])
    assert capsys.readouterr().err == ""
    # a recorded command of run 9 (results/measured/h200/profile.provenance.md)
    args = parse_args(parser, ["--batches", "1,8,64", "--full-batches", "1", "--e2e-batches", "", "--out", "w"])
    assert (args.batches, args.full_batches, args.e2e_batches) == ([1, 8, 64], [1], [])


def test_a_bad_list_item_names_the_flag(capsys):
    parser = argparse.ArgumentParser(prog="qerl x")
    add_list(parser, "--ranks", item_type=int)
    with pytest.raises(SystemExit):
        parser.parse_args(["--ranks", "16", "x"])
    assert "argument --ranks: invalid literal for int() with base 10: 'x'" in capsys.readouterr().err
