"""The contracts between the stages: what one stage writes and a later one reads, stated once.

Why: the Snakemake rules, the trainer, the evaluator and the report used to spell the same paths, keys, labels and
names each on its own, and the report read them defensively, guessing. Every such agreement now lives here, and
everything else imports it:

    methods   the method registry: weights, what is trained, AQN by default, every label and colour tables and
              figures print, the named method groups (SPEED_METHODS, LEARNING_METHODS) and method_lr
    measured  the measured CSVs of `qerl profile`: columns, key, what the report reads
    variants  the `<variant>` grammar of run folders (default, noaqn, aqn-<schedule>, rank<r>, lr<x>, tis<C>,
              norms), spelled by aqn_variant / rank_variant / lr_variant / tis_variant, and AQN_SCHEDULES, the one
              list of AQN schedule names
    paths     the path grammar of results/ (R/runs/<task>/<model>/<method>/<variant>/seed<k>/..., R/evals/...,
              tables, figures) and of the data root
    records   MetricsRow (one line of metrics.jsonl), PassAt1 and BenchmarkRecord (eval files), and their readers

Nothing here imports torch or another qerl package, so the Snakefile can read it at parse time and every stage can
depend on it. Run the tests: `pytest tests/test_contract.py -q`.
"""
from qerl.contract import measured, methods, paths, records, variants
from qerl.contract.methods import (LEARNING_METHODS, METHODS, SPEED_METHODS, TRAINED_METHODS, UNTRAINED_METHODS,
                                   WEIGHT_FORMATS, Method, get_method, method_lr)
from qerl.contract.records import METRIC_FIELDS, WALL_CLOCK_FIELDS, BenchmarkRecord, MetricsRow, PassAt1
from qerl.contract.variants import (AQN_SCHEDULES, aqn_variant, canonical_variant, lr_variant, parse_variant,
                                    rank_variant, tis_variant)

__all__ = [
    "measured", "methods", "paths", "records", "variants",
    "METHODS", "TRAINED_METHODS", "UNTRAINED_METHODS", "WEIGHT_FORMATS", "SPEED_METHODS", "LEARNING_METHODS",
    "Method", "get_method", "method_lr",
    "METRIC_FIELDS", "WALL_CLOCK_FIELDS", "BenchmarkRecord", "MetricsRow", "PassAt1",
    "AQN_SCHEDULES", "aqn_variant", "canonical_variant", "lr_variant", "parse_variant", "rank_variant", "tis_variant",
]
