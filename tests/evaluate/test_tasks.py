"""lm-eval task generation for local JSONL files: the docs, the prompt (one chat template), sampling settings,
repeats kept by the filter, math-verify grading in process_results, settings validation, bad names rejected."""
from __future__ import annotations

import json

import pytest

from qerl.data.prompts import build_prompt
from qerl.evaluate.tasks import (
    EvalSettings,
    Grader,
    build_task,
    check_benchmarks,
    load_problems,
    write_docs,
)

GSM8K_ROWS = [
    {"question": "Tom has 3 apples and buys 4 more. How many apples?", "answer": "3 + 4 = 7\n#### 7"},
    {"question": "A box holds 1,000 pens. How many pens are in 2 boxes?", "answer": "2 * 1000 = 2000\n#### 2,000"},
]


@pytest.fixture()
def gsm8k_root(tmp_path):
    (tmp_path / "gsm8k").mkdir()
    (tmp_path / "gsm8k" / "test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in GSM8K_ROWS))
    return tmp_path


def test_task_reads_the_local_jsonl_with_the_papers_prompt_and_sampling(tmp_path, gsm8k_root, tokenizer):
    problems = load_problems("gsm8k", data_root=gsm8k_root)
    assert [p.answer for p in problems] == ["7", "2000"]
    docs = write_docs(problems, tmp_path / "docs.jsonl")
    settings = EvalSettings(benchmarks=("gsm8k",), n_repeats=3, temperature=0.6, top_p=0.95, max_new_tokens=77)
    task = build_task("gsm8k", docs, tokenizer, settings, Grader(), cache_dir=tmp_path / "cache")
    rows = list(task.test_docs())
    assert [r["answer"] for r in rows] == ["7", "2000"] and [r["doc_index"] for r in rows] == [0, 1]
    assert task.config.repeats == 3
    assert task.config.generation_kwargs == {"until": ["</answer>"], "do_sample": True, "temperature": 0.6,
                                             "top_p": 0.95, "max_gen_toks": 77}
    task.build_all_requests(limit=None, rank=0, world_size=1, apply_chat_template=False)
    contexts = [inst.args[0] for inst in task.instances]
    # exactly our chat-formatted prompt: no second template, no few-shot prefix, no delimiter
    assert contexts == [build_prompt(p.question, tokenizer) for p in problems]
    assert contexts[0].count("<|im_start|>") == 2
    assert all(inst.repeats == 3 for inst in task.instances)
    # the filter keeps every repeat (lm-eval's default, take_first, would grade only the first)
    for inst in task.instances:
        inst.resps = ["<answer> 7 </answer>", "x", "y"]
    task.apply_filters()
    assert task.instances[0].filtered_resps["all_repeats"] == ["<answer> 7 </answer>", "x", "y"]


def test_grader_uses_math_verify_and_averages_the_repeats():
    grader = Grader()
    doc = {"doc_index": 4, "answer": "\\frac{1}{2}"}
    texts = ["<think> ... </think> <answer> 0.5 </answer>", "<answer>\\dfrac12</answer>",
             "so \\boxed{\\frac{2}{4}}", "<answer> 1/3 </answer>", "no answer at all"]
    out = grader.process_results(doc, [texts])
    assert out == {"pass_at_1": pytest.approx(3 / 5)}
    assert [c for _, c in grader.records[4]] == [True, True, True, False, False]
    assert [e for e, _ in grader.records[4]] == ["0.5", "\\dfrac12", "\\frac{2}{4}", "1/3", None]
    # plain numbers: units and thousands separators, but no "number somewhere in the text"
    out = grader.process_results({"doc_index": 0, "answer": "2000"},
                                 [["<answer>$2,000</answer>", "<answer>2000 pens</answer>", "<answer>2000x</answer>"]])
    assert out["pass_at_1"] == pytest.approx(2 / 3)
    with pytest.raises(ValueError, match="expected"):
        grader.process_results(doc, ["<answer>0.5</answer>"])  # a single string: the filter was misconfigured


def test_junk_answer_containing_the_gold_number_is_wrong():
    from qerl.rl.rewards import is_correct

    assert not is_correct("Oli has## 3 loses", "3")
    assert not is_correct("The - = process grow shells9 the 0 times 22 How has , , 0 4 How", "4")


def test_tiny_problems_keep_their_levels(tiny_test_file):
    problems = load_problems("tiny", tiny_test=tiny_test_file, limit=6)
    assert len(problems) == 6 and {p.level for p in problems} <= {1, 2, 3}
    with pytest.raises(ValueError, match="tiny_test"):
        load_problems("tiny")


@pytest.mark.parametrize("names", [["gsm8k", "gsm8"], ["math_train"], ["GSM8K"], []],
                         ids=["typo", "training-set", "case", "empty"])
def test_bad_benchmark_names_rejected(names):
    with pytest.raises(ValueError, match="benchmark"):
        check_benchmarks(names)


def test_settings_from_config_and_bad_values(cfg):
    s = EvalSettings.from_config(cfg, limit=5)
    assert (s.benchmarks, s.n_repeats, s.temperature, s.top_p, s.limit) == (("tiny",), 2, 0.6, 0.95, 5)
    with pytest.raises(ValueError, match="evaluate.n_repeats"):
        EvalSettings.from_config(cfg, n_repeats=0)
    with pytest.raises(ValueError, match="unknown key"):
        EvalSettings.from_config({"evaluate": {"n_repeat": 3}})
    with pytest.raises(ValueError, match="evaluate.repeats"):
        EvalSettings.from_config({"evaluate": {"repeats": 3}})
    with pytest.raises(ValueError, match="evaluate.repeats.aime24"):
        EvalSettings.from_config({"evaluate": {"repeats": {"aime24": 0}}})
    s = EvalSettings.from_config({"evaluate": {"n_repeats": 1, "repeats": {"aime24": 8}}})
    assert (s.for_benchmark("aime24").n_repeats, s.for_benchmark("gsm8k").n_repeats) == (8, 1)
    assert "repeats" in s.record() and "repeats" not in EvalSettings().record()
    with pytest.raises(ValueError, match="unknown benchmark"):
        EvalSettings.from_config({"evaluate": {"benchmarks": ["gsm8k", "mmlu"]}})


def test_schema_rejects_unknown_evaluate_keys_and_benchmarks():
    from qerl.config import ConfigError, validate_config

    with pytest.raises(ConfigError, match="evaluate"):
        validate_config({"evaluate": {"n_samples": 4}}, check_data=False)
    with pytest.raises(ConfigError, match="mmlu"):
        validate_config({"evaluate": {"benchmarks": ["mmlu"]}}, check_data=False)
    filled = validate_config({}, check_data=False)["evaluate"]
    assert (filled["temperature"], filled["top_p"], filled["max_new_tokens"]) == (0.6, 0.95, 4096)


def test_real_benchmarks_load_for_evaluation(shared_data_root):
    sizes = {name: len(load_problems(name, data_root=shared_data_root))
             for name in ("gsm8k", "math500", "aime24", "aime25", "amc23")}
    assert sizes == {"gsm8k": 1319, "math500": 500, "aime24": 30, "aime25": 30, "amc23": 40}
