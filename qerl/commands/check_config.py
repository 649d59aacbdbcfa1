"""`qerl check-config --config FILE`: validate and print the config with defaults filled in."""
from __future__ import annotations

import sys

import yaml

from qerl.config import load_config


def add_arguments(parser) -> None:
    parser.add_argument("--config", required=True, help="YAML config file")
    parser.add_argument("--no-data-check", action="store_true", help="do not require benchmark files to exist")


def run(args) -> int:
    cfg = load_config(args.config, check_data=not args.no_data_check)
    yaml.safe_dump(cfg, sys.stdout, sort_keys=False)
    return 0
