"""`qerl calibrate --config FILE --base DIR --format nvfp4|mxfp4 --out SCALES`: search AWQ per-channel scales of a
base model for one 4-bit format (qerl.quantize.stage.search_scales); prints a summary on stderr."""
from __future__ import annotations

import json
import sys

from qerl.config import load_config
from qerl.quantize.stage import search_scales

__all__ = ["RENAMED", "add_stage_arguments", "add_arguments", "run"]

RENAMED = {"--model-dir": "--base", "--data": "--calib"}  # old spellings still work (qerl.args.parse_args)


def add_stage_arguments(parser, formats: list[str], out_help: str, calib_help: str) -> None:
    """The arguments `qerl calibrate` and `qerl quantize` share (the quantization stage's two steps)."""
    parser.add_argument("--config", required=True, help="YAML config file (validated against the schema)")
    parser.add_argument("--base", required=True, metavar="DIR",
                        help="base checkpoint folder (config.json, weights, tokenizer)")
    parser.add_argument("--format", required=True, choices=formats, help="the 4-bit format")
    parser.add_argument("--out", required=True, help=out_help)
    parser.add_argument("--calib", default=None, metavar="FILE", help=calib_help)
    parser.add_argument("--no-data-check", action="store_true", help="do not require benchmark files to exist")
    parser.add_argument("--device", default="cpu", help="torch device of the search (default cpu; a 7B needs cuda)")


def add_arguments(parser) -> None:
    """Arguments of `qerl calibrate`."""
    add_stage_arguments(parser, ["nvfp4", "mxfp4"], "scales file to write (.safetensors)",
                        "JSONL of problems to calibrate on (default: the file quantize.calibration.source names)")


def run(args) -> int:
    cfg = load_config(args.config, check_data=not args.no_data_check)
    print(json.dumps(search_scales(cfg, args.base, args.format, args.out, args.calib, args.device)), file=sys.stderr)
    return 0
