"""`qerl` command line: the one front door of the harness; it only dispatches.

Every subcommand is one module, qerl/commands/<subcommand>.py (dashes as underscores), holding `add_arguments(parser)`
+ `run(args)`: argument parsing and a call into the library, nothing else. A module is imported only when its command
is called, so `qerl --help` stays fast and a stage's heavy imports (torch, transformers) are paid only by that stage.
Every subcommand that takes `--config` validates it against workflow/schemas/config.schema.yaml first. No library
module imports this file (tests/test_dependencies.py); the argparse helpers all commands share are in qerl/args.py.

One name per concept across subcommands (README "CLI"): `--config FILE`, `--base DIR` (the base model checkpoint),
`--out PATH` (the file or folder written), `--data-root DIR`, and lists space-separated (`--benchmarks gsm8k
math500`, `qerl.args.add_list`). A command module may define `RENAMED = {old: new}`: an old spelling still works and
prints one note on stderr (`qerl.args.parse_args`); the comma form of a list does the same.

When a DAG run's job server is up ($QERL_JOB_SERVER, `resources.job_server`), the console script hands the command
to it: a child forked from a process that has imported the stages already runs `main` with the same arguments.
"""
from __future__ import annotations

import argparse
import importlib
import sys

from qerl import jobserver
from qerl.args import parse_args

__all__ = ["SUBCOMMANDS", "module_name", "main"]

# name -> one-line help; the module is qerl/commands/<name with dashes as underscores>.py. Add a stage by adding a
# module there and one line here.
SUBCOMMANDS: dict[str, str] = {
    "check-config": "validate a config file and print it with defaults filled in",
    "config-docs": "write config/README.md from the config schema",
    "data": "make sure the benchmark files exist (download from the hub when missing and online)",
    "gen-tiny": "generate the tiny scale's arithmetic word problems",
    "pretrain-tiny": "build the tiny tokenizer and Qwen2 model and pretrain it",
    "sft": "supervised warm-up of the base model on a training split's answer format (small scale)",
    "train": "RL-train one run (task, method, variant, seed) with GRPO or DAPO, then evaluate it",
    "grade-check": "grader self-check: gold answers must grade 100, shuffled about 0",
    "render": "render one paper table or figure (or all) beside the paper's numbers",
    "claims": "check the paper's headline claims against this scale's results (Markdown)",
    "evaluate": "pass@1 of a model (any weight format, optional LoRA adapter) through lm-eval",
    "prepare-model": "the base checkpoint of the small and paper scales (GGUF conversion, hub or local model, random "
                     "weights)",
    "calibrate": "search AWQ per-channel scales of a base model for NVFP4 or MXFP4",
    "profile": "rollout tokens/s, GRPO step time and memory at the paper's shapes (GPU)",
    "quantize": "write a quantized checkpoint (NVFP4/MXFP4/NF4) and its layer errors",
    "samples": "write the report's samples page: completions per method at the first and last kept step, and each "
               "reward figure's rollout files",
    "status": "where every training run of a config stands: steps, reward, pass@1, state",
    "job-server": "serve a DAG run's qerl jobs from one process that has imported the stages (started by the "
                  "Snakefile: resources.job_server)",
}


def module_name(command: str) -> str:
    """"grade-check" -> "qerl.commands.grade_check", the module of a subcommand."""
    return "qerl.commands." + command.replace("-", "_")


def main(argv: list[str] | None = None) -> int:
    if argv is None:  # the `qerl` console script: the DAG's job server, when one runs, runs it (qerl/jobserver.py)
        code = jobserver.forward(sys.argv[1:])
        if code is not None:
            return code
    parser = argparse.ArgumentParser(prog="qerl", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, help_ in SUBCOMMANDS.items():
        sub.add_parser(name, help=help_, add_help=False)
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        parser.print_help()
        return 0
    name = argv[0]
    if name not in SUBCOMMANDS:
        parser.error(f"unknown command {name!r}; choose from {', '.join(SUBCOMMANDS)}")
    module = importlib.import_module(module_name(name))
    cmd_parser = argparse.ArgumentParser(prog=f"qerl {name}", description=SUBCOMMANDS[name])
    module.add_arguments(cmd_parser)
    args = parse_args(cmd_parser, argv[1:], getattr(module, "RENAMED", None))
    try:
        return int(module.run(args) or 0)
    except ValueError as exc:  # bad config or data: one clear line, no traceback
        print(f"qerl {name}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
