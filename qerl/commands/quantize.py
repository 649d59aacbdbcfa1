"""`qerl quantize --config FILE --base DIR --format nvfp4|mxfp4|nf4 --out DIR [--scales FILE]`: write the quantized
checkpoint of one format and its layer-output errors (qerl.quantize.stage.write_quantized); prints the mean errors
on stderr."""
from __future__ import annotations

import json
import sys

from qerl.commands.calibrate import RENAMED, add_stage_arguments
from qerl.config import load_config
from qerl.quantize.stage import write_quantized

__all__ = ["RENAMED", "add_arguments", "run"]


def add_arguments(parser) -> None:
    """Arguments of `qerl quantize`."""
    add_stage_arguments(parser, ["nvfp4", "mxfp4", "nf4"], "output folder",
                        "JSONL of problems the held-out sequences of layer_errors.json come from (default: the file "
                        "quantize.calibration.source names, as for `qerl calibrate`)")
    parser.add_argument("--scales", default=None, help="AWQ scales from `qerl calibrate` (nvfp4/mxfp4)")


def run(args) -> int:
    cfg = load_config(args.config, check_data=not args.no_data_check)
    report = write_quantized(cfg, args.base, args.format, args.out, args.scales, args.calib, args.device)
    line = {k: round(v["mean"], 5) for k, v in report.items() if isinstance(v, dict)}
    print(json.dumps({"format": args.format, "method": report["method"], "mean_layer_error": line}), file=sys.stderr)
    return 0
