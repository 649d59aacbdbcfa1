"""`qerl grade-check`: gold answers grade 100 %, shuffled answers about 0 %, exit status, JSON output.

The real benchmarks are read from $QERL_TEST_DATA_ROOT, else from ../shared/data beside the checkout; those tests are
skipped when the files are absent. Run: `pytest tests/evaluate/test_grade_check.py -q`
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("math_verify")

from qerl.cli import main  # noqa: E402
from qerl.evaluate.grade_check import GradeCheck, _derangement, check_answers  # noqa: E402




@pytest.mark.parametrize("n", [2, 3, 10, 501])
def test_derangement_moves_every_answer(n):
    target = _derangement(n, seed=0)
    assert sorted(target) == list(range(n)) and all(target[i] != i for i in range(n))
    assert target == _derangement(n, seed=0) != _derangement(n, seed=1) or n <= 3


def test_check_answers_on_latex_and_numbers():
    answers = ["\\frac{1}{2}", "1,000", "\\sqrt{2}", "(1, 2)", "\\text{(C)}", "x^2 + 1", "27", "-4"]
    res = check_answers("toy", [str(i) for i in range(len(answers))], answers)
    assert (res.gold_pct, res.shuffled_pct) == (100.0, 0.0) and res.passed()
    assert res.gold_failures == [] and res.shuffled_matches == []


def test_pass_rule_and_errors():
    assert not GradeCheck("b", 10, 9, 0).passed()  # one gold answer failed to verify
    assert not GradeCheck("b", 10, 10, 1).passed(max_shuffled_pct=10.0)  # 10 % is not below 10 %
    assert GradeCheck("b", 10, 10, 0).passed()
    with pytest.raises(ValueError, match="at least 2"):
        check_answers("b", ["0"], ["1"])
    with pytest.raises(ValueError, match="2 ids but 1 answers"):
        check_answers("b", ["0", "1"], ["1"])


def _write(root: Path, rows: list[dict]) -> None:
    (root / "aime25").mkdir(parents=True)
    (root / "aime25" / "test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_cli_exit_status_and_json(tmp_path, capsys):
    _write(tmp_path / "good", [{"problem": f"p{i}", "answer": str(100 + i)} for i in range(5)])
    out = tmp_path / "res" / "grade.json"
    assert main(["grade-check", "--benchmarks", "aime25", "--data-root", str(tmp_path / "good"),
                 "--out", str(out)]) == 0
    assert "gold 100.0 %" in capsys.readouterr().out
    (record,) = json.loads(out.read_text())
    assert record["passed"] and record["gold_pct"] == 100.0 and record["shuffled_pct"] == 0.0
    # every problem has the same answer: shuffled answers all grade correct, so the check must fail
    _write(tmp_path / "same", [{"problem": f"p{i}", "answer": "7"} for i in range(5)])
    assert main(["grade-check", "--benchmarks", "aime25", "--data-root", str(tmp_path / "same")]) == 1
    assert "FAIL" in capsys.readouterr().out
    assert main(["grade-check", "--benchmarks", "aime25", "--data-root", str(tmp_path / "missing")]) == 2


def test_real_benchmarks(shared_data_root, capsys):
    names = ["gsm8k", "math500", "aime24", "aime25", "amc23"]
    assert main(["grade-check", "--benchmarks", *names, "--data-root", str(shared_data_root)]) == 0
    lines = capsys.readouterr().out.splitlines()
    for name in names:
        (line,) = [x for x in lines if x.startswith(name + ":")]
        assert "gold 100.0 %" in line and line.endswith("OK")
