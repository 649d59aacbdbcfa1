"""Rollout samples on disk (qerl/rl/rollout_log.py): which steps and prompts are kept, the chunks' bytes and their
reader, what a resume drops. A trained run's samples against its metrics: tests/rl/test_trainer.py."""
from __future__ import annotations

import gzip
import json

import pytest

from qerl.config import validate_config
from qerl.contract.paths import rollout_chunk, rollout_chunks
from qerl.contract.records import RolloutSample, read_rollouts
from qerl.rl.rollout_log import RolloutKeep, drop_from, rollout_keep, write_chunk


def _sample(step, i=0, **kw):
    base = dict(step=step, prompt_id=f"tiny/rl/{i}", sample=i % 4, gold="7", completion="<answer>7</answer> ü",
                reward=1.0, correct=True, length=5, truncated=False, logprob_mean=-0.25, entropy=0.5, sigma=0.01)
    return RolloutSample(**{**base, **kw})


def test_kept_steps_and_prompts():
    keep = RolloutKeep(every=10, share=0.0625, steps=600)
    kept = [k for k in range(600) if keep.keeps(k)]
    assert kept[:3] == [0, 10, 20] and kept[-2:] == [590, 599] and len(kept) == 61
    assert keep.prompts(128) == 8 and keep.prompts(2) == 1  # at least one prompt
    assert RolloutKeep(every=1, share=1.0, steps=3).prompts(16) == 16
    assert not any(RolloutKeep(every=0, share=1.0, steps=5).keeps(k) for k in range(5))
    cfg = validate_config({})
    assert rollout_keep(cfg, 600) == keep  # the schema's defaults are the stated paper-scale bound


def test_chunk_roundtrip_is_reproducible(tmp_path):
    samples = [_sample(3, i) for i in range(4)]
    path = write_chunk(tmp_path, 3, samples)
    assert str(path) == rollout_chunk(tmp_path, 3) and path.name == "step000003.jsonl.gz"
    first = path.read_bytes()
    write_chunk(tmp_path, 3, samples)
    assert path.read_bytes() == first  # no time stamp in the gzip header
    assert read_rollouts(tmp_path / "rollouts") == samples
    line = gzip.decompress(first).decode().splitlines()[0]
    assert list(json.loads(line)) == [f for f in RolloutSample.__dataclass_fields__]  # declaration order


def test_bad_lines_name_file_line_and_key(tmp_path):
    folder = tmp_path / "rollouts"
    folder.mkdir()
    bad = json.loads(_sample(2).to_json())
    bad["correct"] = 1
    (folder / "step000002.jsonl.gz").write_bytes(gzip.compress((json.dumps(bad) + "\n").encode()))
    with pytest.raises(ValueError, match=r"step000002.jsonl.gz:1: key 'correct' must be bool"):
        read_rollouts(folder)
    (folder / "step000002.jsonl.gz").write_bytes(gzip.compress(_sample(5).to_json().encode()))
    with pytest.raises(ValueError, match="key 'step' = 5, but the file holds step 2"):
        read_rollouts(folder)
    (folder / "step000002.jsonl.gz").write_bytes(gzip.compress(b'{"step": "\t"}\n'))
    with pytest.raises(ValueError, match=r"Invalid control character at column \d+\)"):
        read_rollouts(folder)


def test_drop_from_removes_the_steps_to_rerun_and_names_lost_ones(tmp_path, capsys):
    keep = RolloutKeep(every=1, share=1.0, steps=6)
    for k in (0, 2, 3, 4):
        write_chunk(tmp_path, k, [_sample(k)])
    assert drop_from(tmp_path, 3, keep) == [1]
    assert [k for k, _ in rollout_chunks(tmp_path / "rollouts")] == [0, 2]
    assert "lacks the rollout samples of step(s) [1] before step 3" in capsys.readouterr().err
    assert drop_from(tmp_path, 0, keep, say=False) == [] and rollout_chunks(tmp_path / "rollouts") == []
