"""The stage contracts (qerl/contract): one list of names that the schema, the noise schedules and the variant
grammar agree on, the path grammar the Snakemake rules use, and the typed records of metrics.jsonl and eval files."""
from __future__ import annotations

import json
import math

import pytest
import yaml

from qerl.config import SCHEMA_PATH
from qerl.contract import (AQN_SCHEDULES, METRIC_FIELDS, TRAINED_METHODS, UNTRAINED_METHODS, BenchmarkRecord,
                           MetricsRow, PassAt1, get_method, parse_variant)
from qerl.contract import paths
from qerl.contract.records import read_metrics_rows


def _schema():
    return yaml.safe_load(SCHEMA_PATH.read_text())


def test_schedule_names_are_one_list():
    from qerl.noise.schedule import SCHEDULES

    train = _schema()["properties"]["train"]["properties"]
    assert tuple(SCHEDULES) == AQN_SCHEDULES
    assert set(train["aqn"]["properties"]["schedule"]["enum"]) == set(AQN_SCHEDULES)
    assert set(train["ablations"]["properties"]["aqn_schedules"]["items"]["enum"]) == set(AQN_SCHEDULES)
    for name in AQN_SCHEDULES:
        assert parse_variant(f"aqn-{name}") == {"aqn": True, "aqn_schedule": name}
    with pytest.raises(ValueError, match="unknown variant"):
        parse_variant("aqn-quadratic")


def test_method_names_are_one_list():
    props = _schema()["properties"]
    assert props["train"]["properties"]["methods"]["items"]["enum"] == TRAINED_METHODS
    assert set(props["evaluate"]["properties"]["methods"]["items"]["enum"]) == set(UNTRAINED_METHODS)
    labels = {m: (get_method(m).label, get_method(m).short, get_method(m).wbits) for m in ("full", "qlora", "qerl")}
    assert labels == {"full": ("BF16 Full", "Full", "BF16"), "qlora": ("NF4 LoRA (QLoRA)", "QLoRA", "NF4"),
                      "qerl": ("NVFP4 LoRA + AQN (QeRL)", "QeRL", "NVFP4")}
    assert get_method("full").prose == "BF16 full" and get_method("lora").prose == "BF16 LoRA"


def test_path_grammar_passes_snakemake_wildcards_through():
    R = paths.results_root("results", "tiny")
    assert R == "results/tiny" == paths.root_of({"results_dir": "results", "scale": "tiny"})
    assert paths.run_dir(R, "{task}", "{model}", "{method}", "{variant}", "{seed}") == \
        "results/tiny/runs/{task}/{model}/{method}/{variant}/seed{seed}"
    assert paths.run_dir(R, "tiny_grpo", "tiny", "qerl", "default", 2) == \
        "results/tiny/runs/tiny_grpo/tiny/qerl/default/seed2"
    assert paths.eval_file(R, "tiny", "nvfp4", "tiny", 0) == "results/tiny/evals/tiny/nvfp4/tiny/seed0.json"
    assert paths.tiny_split(R, "rl") == "results/tiny/data/tiny/rl.jsonl"
    assert paths.artifact_file(R, "table", "table1", "md") == "results/tiny/tables/table1.md"
    with pytest.raises(ValueError, match="unknown tiny data split"):
        paths.tiny_split(R, "train")
    with pytest.raises(ValueError, match="unknown artifact kind"):
        paths.artifact_file(R, "plot", "fig1", "png")
    assert paths.task_benchmarks({"source": "math_train"}) == ["math500", "aime24", "aime25", "amc23"]
    assert paths.task_benchmarks({"source": "gsm8k", "eval_benchmarks": ["math500"]}) == ["math500"]


def _row(step: int = 0, **kw) -> MetricsRow:
    values = {name: 0.5 for name in METRIC_FIELDS}
    values.update(step=step, peak_memory_bytes=10, skipped_updates=0, rollout_tokens=7, **kw)
    return MetricsRow(**values)


def test_metrics_row_round_trip_keeps_the_field_order(tmp_path):
    line = _row(0, mismatch_kl=float("nan")).to_json()
    assert list(json.loads(line)) == list(METRIC_FIELDS)
    path = tmp_path / "metrics.jsonl"
    path.write_text(line + "\n" + _row(1).to_json() + "\n")
    rows = read_metrics_rows(path)
    assert [r.step for r in rows] == [0, 1] and math.isnan(rows[0].mismatch_kl) and rows[1].rollout_tokens == 7


@pytest.mark.parametrize("edit, message", [
    (lambda d: d.pop("entropy"), "m.jsonl:2: missing key(s) ['entropy']"),
    (lambda d: d.update(extra=1), "m.jsonl:2: unknown key(s) ['extra']"),
    (lambda d: d.update(step=1.0), "m.jsonl:2: key 'step' must be an integer"),
    (lambda d: d.update(reward="high"), "m.jsonl:2: key 'reward' must be a number or null"),
    (lambda d: d.update(step=0), "m.jsonl:2: key 'step' = 0 does not increase"),
], ids=["missing", "unknown", "float-step", "non-number", "step-order"])
def test_metrics_errors_name_file_line_and_key(tmp_path, edit, message):
    bad = json.loads(_row(1).to_json())
    edit(bad)
    path = tmp_path / "m.jsonl"
    path.write_text(_row(0).to_json() + "\n" + json.dumps(bad) + "\n")
    with pytest.raises(ValueError) as err:
        read_metrics_rows(path)
    assert message in str(err.value)


def _record(**kw) -> dict:
    whole = PassAt1(40.0, 2.0, 10, 2, [40.0, 40.0])
    rec = {**whole.__dict__, "pass_at_1_strict": 30.0, "stderr_strict": None,
           "per_level": {"1": {**PassAt1(50.0, 1.0, 5, 2, [50.0, 50.0]).__dict__, "pass_at_1_strict": 45.0}}}
    rec.update(kw)
    return rec


def test_benchmark_record_reads_the_evaluators_spelling():
    r = BenchmarkRecord.parse(_record(), "eval.json: benchmarks.tiny")
    assert (r.pass_at_1, r.n_problems, r.n_repeats, r.pass_at_1_strict) == (40.0, 10, 2, 30.0)
    assert math.isnan(r.stderr_strict) and r.per_level == {"1": 50.0}


@pytest.mark.parametrize("record, message", [
    ({"pass@1": 40.0, "n": 3}, "missing key(s) ['pass_at_1', 'stderr'"),
    (_record(pass_at_1=140.0), "key 'pass_at_1' = 140.0 is not a percentage"),
    (_record(n_problems=-1), "key 'n_problems' must be a non-negative integer"),
    (_record(per_level={"1": 50.0}), "key 'per_level.1' must be a mapping with pass_at_1"),
], ids=["old-spelling", "range", "count", "level"])
def test_benchmark_record_errors_name_the_key(record, message):
    with pytest.raises(ValueError) as err:
        BenchmarkRecord.parse(record, "x/eval.json: benchmarks.a")
    assert "x/eval.json: benchmarks.a" in str(err.value) and message in str(err.value)


def test_measured_csvs_are_one_definition():
    """The profiler writes `columns`, resumes and commits on `key`, and the report reads `required` + `optional`:
    each must be columns the profiler writes."""
    from qerl.contract.measured import MEASURED_CSVS

    assert set(MEASURED_CSVS) == {"rollout.csv", "e2e.csv", "memory.csv", "rollout_hf.csv"}
    for name, spec in MEASURED_CSVS.items():
        assert len(set(spec.columns)) == len(spec.columns), name
        for part in (spec.key, spec.required, spec.optional):
            assert set(part) <= set(spec.columns), (name, set(part) - set(spec.columns))
        assert not set(spec.required) & set(spec.optional), name


def test_the_report_reads_what_the_profiler_writes(tmp_path):
    """A header of exactly `columns` is read by the report's reader of each file (no second column list there)."""
    from qerl.contract.measured import E2E, MEMORY, ROLLOUT
    from qerl.report import inputs

    values = {"model": "Qwen2.5-7B-Instruct", "method": "qerl", "rank": "32", "batch": "2", "tokens_per_s": "10",
              "gradient_checkpointing": "true", "step_s": "1.5", "model_size_gb": "4.2", "peak_gb": "OOM"}
    for spec, reader in ((ROLLOUT, inputs.read_rollout_csv), (E2E, inputs.read_e2e_csv),
                         (MEMORY, inputs.read_memory_csv)):
        path = tmp_path / spec.name
        path.write_text(",".join(spec.columns) + "\n" + ",".join(values.get(c, "") for c in spec.columns) + "\n")
        [row] = reader(path)
        assert row["model"] == "7B" and row["method"] == "qerl", spec.name
        path.write_text(",".join(c for c in spec.columns if c != spec.required[-1]) + "\n")
        with pytest.raises(ValueError, match=spec.required[-1]):
            reader(path)


def test_variant_names_spell_and_parse_back():
    from qerl.contract.variants import aqn_variant, rank_variant

    assert aqn_variant("linear") == "aqn-linear" and parse_variant(aqn_variant("cosine"))["aqn_schedule"] == "cosine"
    assert rank_variant(64) == "rank64" and parse_variant(rank_variant(64)) == {"lora_rank": 64}
    with pytest.raises(ValueError, match="unknown AQN schedule 'step'"):
        aqn_variant("step")


def test_method_lr_and_groups():
    from qerl.contract.methods import LEARNING_METHODS, METHODS, SPEED_METHODS, method_lr

    cfg = {"train": {"lr": 1e-5, "lr_by_method": {"qerl": 3e-5}}}
    assert method_lr(cfg, "qerl") == 3e-5 and method_lr(cfg, "lora") == 1e-5
    assert set(SPEED_METHODS) | set(LEARNING_METHODS) <= set(METHODS)
    assert all(METHODS[m].color and METHODS[m].speed for m in SPEED_METHODS)
