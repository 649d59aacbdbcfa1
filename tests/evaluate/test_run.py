"""evaluate_model end to end: pass@1 and its standard error over repeats, the per-sample log, levels, every weight
format, the adapter-active probe, the results file and the `qerl evaluate` command."""
from __future__ import annotations

import json
import math

import pytest
import torch

from qerl.evaluate.adapter_check import AdapterNotActiveError, check_adapter_active
from qerl.evaluate.run import evaluate_model
from qerl.evaluate.stats import pass_at_1_stats
from qerl.evaluate.tasks import EvalSettings

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def test_pass_at_1_is_the_mean_over_repeats_with_the_stderr_over_problems():
    s = pass_at_1_stats([[True, False], [True, True], [False, False]])
    assert s["pass_at_1"] == pytest.approx(50.0)
    # per-problem means 0.5, 1, 0: sample std 0.5, over sqrt(3) problems
    assert s["stderr"] == pytest.approx(100 * 0.5 / math.sqrt(3))
    assert s["per_repeat"] == pytest.approx([200 / 3, 100 / 3])
    assert (s["n_problems"], s["n_repeats"]) == (3, 2)
    assert pass_at_1_stats([[True, False, True, True]])["stderr"] is None
    with pytest.raises(ValueError, match="same positive number"):
        pass_at_1_stats([[True], [True, False]])


@pytest.fixture()
def answer_file(tmp_path):
    """Four problems with known gold answers 8, 9, 8, 10 on levels 1, 1, 2, 2."""
    rows = [{"id": f"p{i}", "question": "Ann has 3 apples . How many apples does Ann have now ?",
             "answer": f"3 + {g - 3} = {g} .\n#### {g}", "level": lv}
            for i, (g, lv) in enumerate([(8, 1), (9, 1), (8, 2), (10, 2)])]
    path = tmp_path / "answers.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_scores_and_per_sample_log_match_known_completions(tokenizer, scripted, cfg, answer_file):
    # the model answers 8 or 9 with equal probability: gold 10 is never right
    model = scripted("<think> 3 + 5 = 8 </think> <answer> 8 </answer>", choices={8: ["8", "9"]})
    settings = EvalSettings.from_config(cfg, max_new_tokens=32)
    res = evaluate_model(model, tokenizer, ["tiny"], cfg, seed=3, tiny_test=answer_file, settings=settings)
    b = res["benchmarks"]["tiny"]
    assert (b["n_problems"], b["n_repeats"]) == (4, 2)
    verdicts = []
    for s in b["samples"]:
        assert len(s["completions"]) == len(s["extracted"]) == len(s["correct"]) == 2
        assert all(t.endswith("</answer>") for t in s["completions"]) and s["finish"] == ["stop", "stop"]
        assert all(e in ("8", "9") for e in s["extracted"])
        assert s["correct"] == [e == s["gold"] for e in s["extracted"]]
        verdicts.append(s["correct"])
    assert [s["gold"] for s in b["samples"]] == ["8", "9", "8", "10"]
    assert b["samples"][3]["correct"] == [False, False]
    assert b["pass_at_1"] == pytest.approx(pass_at_1_stats(verdicts)["pass_at_1"])
    assert b["lm_eval"]["pass_at_1"] == pytest.approx(b["pass_at_1"])
    assert b["lm_eval"]["stderr"] == pytest.approx(b["stderr"])
    assert set(b["per_level"]) == {"1", "2"} and b["per_level"]["2"]["n_problems"] == 2
    assert b["answer_found_pct"] == 100.0 and b["formatted_pct"] == 100.0 and b["truncated_pct"] == 0.0
    assert b["pass_at_1_strict"] == pytest.approx(b["pass_at_1"])  # every completion has the exact shape
    # the same seed gives the same samples; the global RNG does not matter
    torch.manual_seed(999)
    again = evaluate_model(model, tokenizer, ["tiny"], cfg, seed=3, tiny_test=answer_file,
                           settings=settings)["benchmarks"]["tiny"]
    assert [s["extracted"] for s in again["samples"]] == [s["extracted"] for s in b["samples"]]


def test_bad_benchmark_rejected_before_any_work(tokenizer, tiny_model, cfg):
    with pytest.raises(ValueError, match="unknown benchmark"):
        evaluate_model(tiny_model, tokenizer, ["tiny", "gsm9k"], cfg, seed=0)


@pytest.mark.parametrize("fmt", ["bf16", "nvfp4", "mxfp4", "nf4"])
def test_every_weight_format_evaluates(fmt, tokenizer, tiny_model, cfg, tiny_test_file):
    from qerl.policy import checkpoint_format, quantize_model

    if fmt == "nf4":
        from baselines.nf4 import bitsandbytes_cpu_problem

        if bitsandbytes_cpu_problem():
            pytest.skip(bitsandbytes_cpu_problem())
    quantize_model(tiny_model, fmt).eval()
    assert checkpoint_format(tiny_model) == fmt
    res = evaluate_model(tiny_model, tokenizer, ["tiny"], cfg, seed=0, limit=3, tiny_test=tiny_test_file)
    b = res["benchmarks"]["tiny"]
    assert (b["n_problems"], b["n_repeats"]) == (3, 2)
    assert all(n <= 8 for s in b["samples"] for n in s["n_tokens"])
    assert 0.0 <= b["pass_at_1"] <= 100.0
    assert res["adapter_check"] is None and not tiny_model.training


def _lora(model, trained: bool):
    from peft import get_peft_model

    from qerl.layers.lora import lora_config

    peft_model = get_peft_model(model, lora_config(r=4, lora_alpha=8, target_modules=TARGETS))
    if trained:  # a trained-ish adapter: lora_B away from its zero initialisation
        gen = torch.Generator().manual_seed(0)
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.data.normal_(0.0, 0.02, generator=gen)
    return peft_model.eval()


@pytest.mark.parametrize("fmt", ["bf16", "nvfp4"])
def test_adapter_probe_passes_for_a_trained_adapter_and_fails_for_an_identity_one(fmt, tokenizer, tiny_model, cfg,
                                                                                  tiny_test_file):
    from qerl.policy import quantize_model

    quantize_model(tiny_model, fmt).eval()
    identity = _lora(tiny_model, trained=False)
    with pytest.raises(AdapterNotActiveError, match="does not change the model"):
        check_adapter_active(identity, tokenizer)
    with pytest.raises(AdapterNotActiveError):  # evaluate_model checks any peft model by itself
        evaluate_model(identity, tokenizer, ["tiny"], cfg, seed=0, limit=2, tiny_test=tiny_test_file)
    trained = _lora(_fresh(tokenizer, fmt), trained=True)
    report = check_adapter_active(trained, tokenizer)
    assert report["passed"] and report["lora_modules"] == 2 * len(TARGETS) and report["max_abs_logit_diff"] > 0
    with trained.disable_adapter(), pytest.raises(AdapterNotActiveError):
        check_adapter_active(trained, tokenizer)  # the adapter switched off counts as absent
    res = evaluate_model(trained, tokenizer, ["tiny"], cfg, seed=0, limit=2, tiny_test=tiny_test_file)
    assert res["adapter_check"]["passed"]


def _fresh(tokenizer, fmt):
    from qerl.models.tiny import build_model
    from qerl.policy import quantize_model

    return quantize_model(build_model(tokenizer, seed=0).eval(), fmt).eval()


def test_required_adapter_missing_is_an_error(tokenizer, tiny_model, cfg, tiny_test_file):
    with pytest.raises(AdapterNotActiveError, match="never applied"):
        evaluate_model(tiny_model, tokenizer, ["tiny"], cfg, seed=0, limit=2, tiny_test=tiny_test_file,
                       require_adapter=True)


def test_cli_writes_the_results_json(tmp_path, tokenizer, tiny_model, tiny_test_file, repo_root, capsys):
    from qerl.cli import main

    model_dir = tmp_path / "base"
    tiny_model.save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    out = tmp_path / "evals" / "r.json"
    rc = main(["evaluate", "--config", str(repo_root / "config" / "config.yaml"), "--base", str(model_dir),
               "--format", "mxfp4", "--method", "mxfp4", "--benchmarks", "tiny", "--tiny-test", str(tiny_test_file),
               "--limit", "3", "--n-repeats", "2", "--max-new-tokens", "6", "--seed", "1", "--out", str(out)])
    assert rc == 0
    res = json.loads(out.read_text())
    assert res["model"]["format"] == "mxfp4" and res["model"]["method"] == "mxfp4" and res["seed"] == 1
    assert res["settings"]["n_repeats"] == 2 and res["benchmarks"]["tiny"]["n_problems"] == 3
    assert "tiny (seed 1): pass@1" in capsys.readouterr().out
    assert [p.name for p in out.parent.iterdir()] == ["r.json"]  # no temporary file left behind
    # several seeds, the model built once (the DAG's grouped evaluation job): each file is that seed's own call's
    seeds = [tmp_path / "evals" / "s2.json", tmp_path / "evals" / "s1.json"]
    rc = main(["evaluate", "--config", str(repo_root / "config" / "config.yaml"), "--base", str(model_dir),
               "--format", "mxfp4", "--method", "mxfp4", "--benchmarks", "tiny", "--tiny-test", str(tiny_test_file),
               "--limit", "3", "--n-repeats", "2", "--max-new-tokens", "6", "--seed", "2", "1",
               "--out", *map(str, seeds)])
    assert rc == 0

    def timeless(path):
        r = json.loads(path.read_text())
        # wall-clock fields: seconds, and the process's peak memory (the host's max RSS on a CPU, which the first
        # call in this process may or may not have set already)
        del r["seconds"], r["benchmarks"]["tiny"]["seconds"], r["peak_memory_bytes"]
        return r

    assert timeless(seeds[1]) == timeless(out) and timeless(seeds[0])["seed"] == 2
    assert timeless(seeds[0])["benchmarks"] != timeless(out)["benchmarks"]
    rc = main(["evaluate", "--config", str(repo_root / "config" / "config.yaml"), "--base", str(model_dir),
               "--benchmarks", "tiny", "--seed", "1", "2", "--out", str(tmp_path / "one.json")])
    assert rc == 2 and "--seed gives 2 seed(s) (1 2) but --out 1 file(s)" in capsys.readouterr().err
    rc = main(["evaluate", "--config", str(repo_root / "config" / "config.yaml"), "--base", str(model_dir),
               "--benchmarks", "tiny", "gsm8", "--out", str(tmp_path / "bad.json")])
    assert rc == 2 and "gsm8" in capsys.readouterr().err
