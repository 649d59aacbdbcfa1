"""Input readers: contracts enforced with file:line / key messages, seed statistics, model labels."""
from __future__ import annotations

import json
import math

import pytest

from qerl.contract.records import METRIC_FIELDS
from qerl.report.inputs import (
    paper_model_label,
    read_e2e_csv,
    read_eval,
    read_metrics,
    read_rollout_csv,
    read_untrained_eval,
    summarize,
)

GOOD = {name: 0.5 for name in METRIC_FIELDS} | {"step": 0, "kl": None, "peak_memory_bytes": 1000,
                                                "skipped_updates": 0, "rollout_tokens": 30}


def _write(path, rows):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def test_summarize_mean_and_sample_std():
    s = summarize([52.0, 54.0, 59.0])
    assert s.n == 3 and s.mean == pytest.approx(55.0) and s.std == pytest.approx(math.sqrt(13.0))
    one = summarize([7.0])
    assert one.mean == 7.0 and one.std is None and one.n == 1
    assert summarize([float("nan"), 1.0, 3.0]).n == 2
    assert summarize([]).n == 0


def test_read_metrics_columns_and_null(tmp_path):
    cols = read_metrics(_write(tmp_path / "m.jsonl", [GOOD, {**GOOD, "step": 1, "reward": 0.7}]))
    assert cols["step"] == [0.0, 1.0] and cols["reward"] == [0.5, 0.7] and math.isnan(cols["kl"][0])
    assert list(cols) == list(METRIC_FIELDS) and cols["rollout_tokens"] == [30.0, 30.0]


@pytest.mark.parametrize("bad,message", [
    ("{not json", "m.jsonl:2: not valid JSON"),
    ([1, 2], "m.jsonl:2: expected a JSON object"),
    ({k: v for k, v in GOOD.items() if k != "entropy"} | {"step": 1}, "m.jsonl:2: missing key(s) ['entropy']"),
    ({**GOOD, "step": 1, "reward": "high"}, "m.jsonl:2: key 'reward' must be a number"),
    ({**GOOD, "step": 1, "pass@1": 3.0}, "m.jsonl:2: unknown key(s) ['pass@1']"),
    ({**GOOD, "step": 0}, "m.jsonl:2: key 'step' = 0 does not increase"),
    ({**GOOD, "step": 1.5}, "m.jsonl:2: key 'step' must be an integer"),
], ids=["json", "not-object", "missing-key", "non-number", "unknown-key", "step-order", "float-step"])
def test_read_metrics_errors_name_file_and_line(tmp_path, bad, message):
    path = _write(tmp_path / "m.jsonl", [GOOD, json.dumps(bad) if not isinstance(bad, str) else bad])
    with pytest.raises(ValueError) as err:
        read_metrics(path)
    assert message in str(err.value)


def test_read_metrics_empty(tmp_path):
    with pytest.raises(ValueError, match="no metrics lines"):
        read_metrics(_write(tmp_path / "m.jsonl", []))


def _rec(**kw) -> dict:
    rec = {"pass_at_1": 40.0, "stderr": 1.0, "pass_at_1_strict": 30.0, "stderr_strict": None, "n_problems": 10,
           "n_repeats": 2, "per_level": {"1": {"pass_at_1": 50.0, "stderr": 2.0}}}
    return {**rec, **kw}


def test_read_eval_reads_the_contract(tmp_path):
    path = tmp_path / "eval.json"
    path.write_text(json.dumps({"benchmarks": {"a": _rec(), "b": _rec(pass_at_1=20.0, stderr=None, n_problems=5)},
                                "provenance": {"commit": "abc", "hardware": {"cpu": "X"}}}))
    results, prov = read_eval(path)
    assert results["a"].pass_at_1 == 40.0 and results["a"].per_level == {"1": 50.0}
    assert results["a"].pass_at_1_strict == 30.0 and math.isnan(results["a"].stderr_strict)
    assert results["b"].pass_at_1 == 20.0 and results["b"].n_problems == 5 and math.isnan(results["b"].stderr)
    assert prov["commit"] == "abc"


@pytest.mark.parametrize("record,message", [
    ({"pass@1": 40.0, "n": 3}, "benchmarks.a: missing key(s) ['pass_at_1', 'stderr'"),
    (_rec(pass_at_1=140.0), "is not a percentage"),
    (_rec(n_problems=-1), "key 'n_problems' must be a non-negative integer"),
    (_rec(per_level=[1]), "key 'per_level' must be a mapping"),
], ids=["old-spelling", "range", "n", "levels"])
def test_read_eval_errors_name_file_and_key(tmp_path, record, message):
    path = tmp_path / "eval.json"
    path.write_text(json.dumps({"benchmarks": {"a": record}}))
    with pytest.raises(ValueError) as err:
        read_eval(path)
    assert str(path) in str(err.value) and message in str(err.value)


def test_read_untrained_eval(tmp_path):
    nested = tmp_path / "nested.json"
    nested.write_text(json.dumps({"benchmarks": {"tiny": _rec(pass_at_1=31.0, n_problems=7)}}))
    assert read_untrained_eval(nested, "tiny")[0].pass_at_1 == 31.0
    with pytest.raises(ValueError, match="benchmarks.gsm8k' is missing"):
        read_untrained_eval(nested, "gsm8k")
    flat = tmp_path / "flat.json"  # a bare record is not an eval file
    flat.write_text(json.dumps(_rec()))
    with pytest.raises(ValueError, match="'benchmarks' mapping"):
        read_untrained_eval(flat, "tiny")
    bad = tmp_path / "bad.json"
    bad.write_text("{\n  oops")
    with pytest.raises(ValueError, match=r"bad.json:2: not valid JSON"):
        read_untrained_eval(bad, "tiny")


def test_measured_csv_readers(tmp_path):
    roll = tmp_path / "rollout.csv"
    roll.write_text("model,method,rank,batch,tokens_per_s\nQwen2.5-14B-Instruct,qerl,16,1,95.3\n")
    assert read_rollout_csv(roll) == [{"model": "14B", "model_name": "Qwen2.5-14B-Instruct", "method": "qerl",
                                      "rank": 16, "batch": 1, "tokens_per_s": 95.3}]
    # both timings of a configuration: the bucket row, wherever it stands; one row per configuration, in file order
    roll.write_text("model,method,rank,batch,tokens_per_s,timing\n7B,lora,32,1,146.9,full\n7B,lora,32,1,146.2,buckets\n"
                    "7B,qerl,32,1,278.6,buckets\n7B,qerl,32,1,276.8,full\n7B,qerl,32,8,1705,buckets\n")
    assert [(r["method"], r["batch"], r["tokens_per_s"]) for r in read_rollout_csv(roll)] == [
        ("lora", 1, 146.2), ("qerl", 1, 278.6), ("qerl", 8, 1705.0)]
    roll.write_text("model,method,rank,batch,tokens_per_s\n7B,lora,32,1,146.9\n7B,lora,32,1,146.2\n")  # no column
    assert [r["tokens_per_s"] for r in read_rollout_csv(roll)] == [146.9]
    e2e = tmp_path / "e2e.csv"
    e2e.write_text("model,method,batch,gradient_checkpointing,step_s\n7B,lora,8,yes,OOM\n7B,qerl,8,no,fast\n")
    with pytest.raises(ValueError, match=r"e2e.csv:3: column 'step_s' must be a number, got 'fast'"):
        read_e2e_csv(e2e)
    e2e.write_text("model,method,batch,step_s\n")
    with pytest.raises(ValueError, match=r"e2e.csv:1: missing column\(s\) \['gradient_checkpointing'\]"):
        read_e2e_csv(e2e)


@pytest.mark.parametrize("name,label", [("Qwen2.5-7B-Instruct", "7B"), ("qwen2.5-14b", "14B"), ("tiny", "tiny"),
                                        ("smollm2-135m", "smollm2-135m"), ("32B", "32B")])
def test_paper_model_label(name, label):
    assert paper_model_label(name) == label
