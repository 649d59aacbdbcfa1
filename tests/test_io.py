"""qerl.io: a file or folder appears whole under its final name or not at all; nothing temporary is left."""
from __future__ import annotations

import json
import os

import pytest

from qerl.io import atomic_dir, atomic_file, write_bytes, write_json, write_jsonl, write_text


def _names(folder):
    return sorted(p.name for p in folder.iterdir())


def test_writers_write_exactly_and_leave_no_temporary(tmp_path):
    write_text(tmp_path / "a" / "t.md", "é\n")
    write_bytes(tmp_path / "a" / "b.bin", b"\x00\x01")
    write_json(tmp_path / "a" / "j.json", {"b": 1, "a": [2]}, sort_keys=True)
    write_jsonl(tmp_path / "a" / "r.jsonl", [{"x": "é"}, {"y": 2}], ensure_ascii=False)
    folder = tmp_path / "a"
    assert (folder / "t.md").read_text(encoding="utf-8") == "é\n"
    assert (folder / "b.bin").read_bytes() == b"\x00\x01"
    assert (folder / "j.json").read_text() == json.dumps({"a": [2], "b": 1}, indent=2) + "\n"
    assert (folder / "r.jsonl").read_text(encoding="utf-8") == '{"x": "é"}\n{"y": 2}\n'
    assert _names(folder) == ["b.bin", "j.json", "r.jsonl", "t.md"]


def test_files_get_the_permissions_of_a_plain_open(tmp_path):
    mask = os.umask(0o022)
    try:
        path = write_text(tmp_path / "f.txt", "x")
    finally:
        os.umask(mask)
    assert path.stat().st_mode & 0o777 == 0o644  # not tempfile's 0600


def test_a_failed_write_keeps_the_old_file_and_removes_the_temporary(tmp_path):
    path = write_text(tmp_path / "f.json", "old")
    with pytest.raises(TypeError):
        write_json(path, {"not serializable": object()})
    with pytest.raises(RuntimeError), atomic_file(path) as tmp:
        tmp.write_text("half")
        raise RuntimeError("killed")
    assert path.read_text() == "old" and _names(tmp_path) == ["f.json"]


def test_atomic_dir_replaces_the_folder_whole_or_not_at_all(tmp_path):
    out = tmp_path / "ckpt"
    with atomic_dir(out) as tmp:
        (tmp / "a").write_text("1")
        assert not out.exists()  # nothing under the final name until the block ends
    with pytest.raises(RuntimeError), atomic_dir(out) as tmp:
        (tmp / "b").write_text("2")
        raise RuntimeError("killed")
    assert _names(out) == ["a"] and _names(tmp_path) == ["ckpt"]
    (tmp_path / ".ckpt.partial").mkdir()  # left by a killed process: removed by the next write
    (tmp_path / ".ckpt.partial" / "stale").write_text("x")
    with atomic_dir(out) as tmp:
        (tmp / "c").write_text("3")
    assert _names(out) == ["c"] and _names(tmp_path) == ["ckpt"]
