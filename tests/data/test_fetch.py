"""`qerl data`: conversion of hub rows, the offline path, atomic writes and the manifest. No network is touched:
the downloader and the online check are replaced by fakes, or HF_HUB_OFFLINE=1 is set.

Run: `pytest tests/data/test_fetch.py -q`
"""
from __future__ import annotations

import json
import socket
import time
from pathlib import Path

import pytest

from qerl.data import fetch
from qerl.data.benchmarks import BENCHMARK_FILES, load_benchmark
from qerl.data.convert import convert_competition, convert_gsm8k, convert_math500, convert_math_train
from qerl.data.fetch import (
    HUB_SOURCES,
    MATH_SUBJECTS,
    fetch_file,
    file_sha256,
    hub_reachable,
)
from qerl.io import write_jsonl


def _config(tmp_path: Path, benchmarks: list[str], download: bool = True) -> Path:
    root = tmp_path / "data"
    path = tmp_path / "config.yaml"
    path.write_text(
        f"data:\n  root: {root}\n  download: {str(download).lower()}\n  benchmarks: {json.dumps(benchmarks)}\n"
    )
    return path


def _never_online(timeout: float) -> bool:
    return False


def _always_online(timeout: float) -> bool:
    return True


def _no_download(repo, config, split):
    raise AssertionError(f"the network must not be touched (asked for {repo} {config} {split})")


MATH500_PROBLEM = "What is $1+1$?"


def _fake_hub(repo: str, config: str | None, split: str) -> list[dict]:
    """Small rows shaped like each public dataset's."""
    if repo == "openai/gsm8k":
        return [{"question": f"{split} q{i}", "answer": f"{i} + {i} = {2 * i}\n#### {2 * i:,}"} for i in (1, 600)]
    if repo == "HuggingFaceH4/MATH-500":
        return [{"problem": MATH500_PROBLEM, "solution": "It is $\\boxed{2}$.", "answer": "2",
                 "subject": "Algebra", "level": 1, "unique_id": "test/algebra/1.json"}]
    if repo == "HuggingFaceH4/aime_2024":
        return [{"id": 60, "problem": "Find x.", "solution": "so $\\boxed{025}$", "answer": "025", "url": "u"}]
    if repo == "math-ai/aime25":
        return [{"problem": "Find y.", "answer": "70", "id": "0"}]
    if repo == "math-ai/amc23":
        return [{"question": "Find z.", "answer": 27.0, "id": 0, "url": "u"}]
    if repo == "EleutherAI/hendrycks_math":
        assert config in MATH_SUBJECTS and split == "test"
        return [
            {"problem": MATH500_PROBLEM, "level": "Level 1", "type": "Algebra", "solution": "$\\boxed{2}$"},
            {"problem": f"A {config} problem.", "level": "Level 4", "type": config.title(),
             "solution": "Hence $\\boxed{\\frac{3}{4}}$."},
            {"problem": f"An unrated {config} problem.", "level": "Level ?", "type": config, "solution": "\\boxed{1}"},
        ]
    raise AssertionError(f"unexpected repo {repo}")


# ------------------------------------------------------------------------------------------------ conversion


def test_convert_gsm8k():
    rows = convert_gsm8k([{"question": "q", "answer": "a\n#### 5", "extra": 1}])
    assert rows == [{"question": "q", "answer": "a\n#### 5"}]


def test_convert_math500_parses_level_and_fills_answer():
    rows = convert_math500([
        {"problem": "p", "solution": "\\boxed{\\sqrt{2}}", "level": "Level 4", "type": "Geometry"},
        {"problem": "p2", "solution": "\\boxed{3}", "answer": "3", "level": 2, "subject": "Algebra",
         "unique_id": "test/algebra/9.json"},
    ])
    assert rows[0] == {"problem": "p", "solution": "\\boxed{\\sqrt{2}}", "answer": "\\sqrt{2}", "subject": "Geometry",
                       "level": 4}
    assert rows[1]["unique_id"] == "test/algebra/9.json" and rows[1]["level"] == 2


def test_convert_competition_spellings():
    rows = convert_competition([
        {"question": "q", "answer": 27.0, "id": 3},
        {"Problem": "P", "Answer": "025", "ID": "2024-I-1", "Solution": "s"},
        {"problem": "p", "answer": 70, "problem_idx": 1},
    ])
    assert rows == [
        {"id": 3, "problem": "q", "answer": 27.0},
        {"id": "2024-I-1", "problem": "P", "solution": "s", "answer": "025"},
        {"id": 1, "problem": "p", "answer": 70},
    ]


def test_convert_math_train_excludes_math500_and_drops_unusable_rows():
    by_subject = {
        "algebra": [
            {"problem": "keep", "level": "Level 3", "type": "Algebra", "solution": "\\boxed{x^{2}}"},
            {"problem": " excluded ", "level": "Level 2", "type": "Algebra", "solution": "\\boxed{1}"},
            {"problem": "unrated", "level": "Level ?", "type": "Algebra", "solution": "\\boxed{1}"},
            {"problem": "unboxed", "level": "Level 1", "type": "Algebra", "solution": "no box"},
        ]
    }
    rows, dropped = convert_math_train(by_subject, ["excluded"])
    assert rows == [{"problem": "keep", "solution": "\\boxed{x^{2}}", "answer": "x^{2}", "level": 3,
                     "subject": "Algebra"}]
    assert dropped == 2


# ------------------------------------------------------------------------------------------------ network


def test_hub_reachable_respects_offline_env(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(socket, "create_connection", lambda *a, **k: pytest.fail("must not connect"))
    start = time.perf_counter()
    assert hub_reachable() is False
    assert time.perf_counter() - start < 0.1


def test_hub_reachable_does_not_hang(monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)

    def stuck(*args, **kwargs):  # a DNS lookup or connect that never returns in time
        time.sleep(3)
        raise OSError("too late")

    monkeypatch.setattr(socket, "create_connection", stuck)
    start = time.perf_counter()
    assert hub_reachable(timeout=0.2) is False
    assert time.perf_counter() - start < 1.0


def test_hub_reachable_refused(monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)

    def refused(*args, **kwargs):
        raise ConnectionRefusedError("refused")

    monkeypatch.setattr(socket, "create_connection", refused)
    assert hub_reachable(timeout=0.5) is False


# ------------------------------------------------------------------------------------------------ files


def test_fetch_file_download_error_is_value_error_and_writes_nothing(tmp_path):
    def broken(repo, config, split):
        raise ConnectionError("network down")

    with pytest.raises(ValueError, match=r"could not download aime25/test\.jsonl from hub dataset math-ai/aime25"):
        fetch_file("aime25/test.jsonl", tmp_path, broken)
    assert not (tmp_path / "aime25").exists() or not any((tmp_path / "aime25").iterdir())


def test_fetch_file_rejects_rows_that_do_not_validate(tmp_path):
    def wrong(repo, config, split):
        return [{"problem": "p", "solution": "\\boxed{1}", "answer": "2", "level": 1}]

    with pytest.raises(ValueError, match=r"HuggingFaceH4/MATH-500.*row 0: field 'answer': disagrees"):
        fetch_file("math500/test.jsonl", tmp_path, wrong)
    assert not (tmp_path / "math500" / "test.jsonl").exists()


def test_hub_sources_cover_every_file():
    assert set(HUB_SOURCES) == {rel for splits in BENCHMARK_FILES.values() for rel in splits.values()}


# ------------------------------------------------------------------------------------------------ provide()


def test_run_offline_lists_files_to_put_where(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    config = _config(tmp_path, ["gsm8k", "amc23"], download=True)
    with pytest.raises(ValueError) as info:
        fetch.provide(config, download=_no_download)
    text = str(info.value)
    for rel in ("gsm8k/train.jsonl", "gsm8k/test.jsonl", "amc23/test.jsonl"):
        assert str((tmp_path / "data" / rel).resolve()) in text
    assert "not reachable" in text and "openai/gsm8k" in text


def test_run_download_disabled(tmp_path):
    config = _config(tmp_path, ["aime24"], download=False)
    with pytest.raises(ValueError, match=r"data\.download is false[\s\S]*aime24/test\.jsonl"):
        fetch.provide(config, download=_no_download, reachable=_always_online)


def test_cli_offline_exit_code(tmp_path, monkeypatch, capsys):
    from qerl.cli import main

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    config = _config(tmp_path, ["aime25"], download=True)
    assert main(["data", "--config", str(config), "--out", str(tmp_path / "m.json")]) == 2
    assert "aime25/test.jsonl" in capsys.readouterr().err
    assert not (tmp_path / "m.json").exists()


def test_run_downloads_converts_and_writes_manifest(tmp_path):
    names = list(BENCHMARK_FILES)
    config = _config(tmp_path, names, download=True)
    out = tmp_path / "results" / "manifest.json"
    fetch.provide(config, out, download=_fake_hub, reachable=_always_online)
    root = tmp_path / "data"
    manifest = json.loads(out.read_text())
    assert set(manifest["files"]) == set(HUB_SOURCES)
    for rel, info in manifest["files"].items():
        assert info["sha256"] == file_sha256(root / rel)
        assert info["origin"]["downloaded"]["repo"] == HUB_SOURCES[rel].repo
    assert load_benchmark("gsm8k", root, "test")[1].answer == "1200"
    assert [p.answer for p in load_benchmark("aime24", root)] == ["25"]
    assert [p.answer for p in load_benchmark("amc23", root)] == ["27"]
    train = load_benchmark("math_train", root)
    assert len(train) == len(MATH_SUBJECTS) == manifest["files"]["math_train/train.jsonl"]["rows"]
    assert MATH500_PROBLEM not in {p.question for p in train} and {p.level for p in train} == {4}
    assert manifest["files"]["math_train/train.jsonl"]["origin"]["downloaded"]["dropped_rows"] == len(MATH_SUBJECTS)


def test_run_with_files_present_never_touches_network(tmp_path):
    config = _config(tmp_path, ["aime25"], download=True)
    write_jsonl(tmp_path / "data" / "aime25" / "test.jsonl", [{"problem": "p", "answer": "7"}])
    out = tmp_path / "m.json"
    fetch.provide(config, out, download=_no_download, reachable=_never_online)
    info = json.loads(out.read_text())["files"]["aime25/test.jsonl"]
    assert info["rows"] == 1 and info["origin"] == "present"


def test_run_with_no_benchmarks_writes_empty_manifest(tmp_path):
    config = _config(tmp_path, [], download=False)
    out = tmp_path / "m.json"
    fetch.provide(config, out, download=_no_download, reachable=_never_online)
    assert json.loads(out.read_text())["files"] == {}


def test_run_validates_present_files(tmp_path):
    config = _config(tmp_path, ["aime25"], download=False)
    path = tmp_path / "data" / "aime25" / "test.jsonl"
    path.parent.mkdir(parents=True)
    path.write_text('{"problem": "p", "answer": "7"}\n{"problem": "p"}\n')
    with pytest.raises(ValueError, match=r"test\.jsonl:2: missing field 'answer'"):
        fetch.provide(config, tmp_path / "m.json", download=_no_download, reachable=_never_online)
    assert not (tmp_path / "m.json").exists()
