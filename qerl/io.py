"""Atomic writes: a file or folder appears whole under its final name, or not at all.

Why: a killed job must never leave a half-written file that looks finished (Snakemake and the readers take a file
that exists for a finished one). Every writer of the harness goes through these helpers: the data is written to a
temporary name in the destination's own folder (same file system), flushed to disk, then renamed over the
destination with `os.replace`, which is atomic on POSIX. On an error the temporary is removed and the destination
is left as it was.

- `write_text` / `write_bytes` / `write_json` / `write_jsonl`: whole files from memory.
- `atomic_file(path)`: a temporary path for writers that want a path (torch.save, safetensors, csv, shutil).
- `atomic_dir(path)`: a temporary folder that replaces the folder `path` (checkpoints written by save_pretrained).

Files are created with the permissions of a plain `open()` (0666 less the umask), not tempfile's 0600. Temporary
names start with a dot: `.<name>.<random>.tmp` for files (two writers of one path never share a temporary) and
`.<name>.partial` for folders (a folder left by a killed run is removed by the next one, so the space comes back).
"""
from __future__ import annotations

import json
import os
import secrets
import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterable, Iterator

__all__ = ["write_text", "write_bytes", "write_json", "write_jsonl", "atomic_file", "atomic_dir"]


@contextmanager
def atomic_file(path: str | Path) -> Iterator[Path]:
    """A temporary path beside `path`; when the block ends without an error it is renamed to `path`.

    Args:
        path: the destination file (parent folders are created).

    Yields:
        The temporary path to write (it does not exist yet).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_bytes(path: str | Path, data: bytes) -> Path:
    """Write `data` to `path` atomically (flushed to disk before the rename).

    Args:
        path: the destination file (parent folders are created).
        data: the whole content.

    Returns:
        `path`, as a Path.
    """
    path = Path(path)
    with atomic_file(path) as tmp:
        with open(tmp, "xb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
    return path


def write_text(path: str | Path, text: str) -> Path:
    """Write `text` to `path` atomically, encoded as UTF-8; returns `path` as a Path."""
    return write_bytes(path, text.encode("utf-8"))


def write_json(path: str | Path, obj: Any, *, indent: int | None = 2, sort_keys: bool = False,
               default: Any = None) -> Path:
    """Write `obj` as JSON (json.dumps with these arguments, then a newline) to `path` atomically.

    Args:
        path: the destination file.
        obj: a JSON-serializable object.
        indent, sort_keys, default: passed to json.dumps.
    """
    return write_text(path, json.dumps(obj, indent=indent, sort_keys=sort_keys, default=default) + "\n")


def write_jsonl(path: str | Path, rows: Iterable[dict], *, sort_keys: bool = False, ensure_ascii: bool = True) -> Path:
    """Write `rows` as JSON Lines (one json.dumps per line) to `path` atomically.

    Args:
        path: the destination file.
        rows: JSON-serializable objects.
        sort_keys, ensure_ascii: passed to json.dumps.
    """
    return write_text(path, "".join(json.dumps(r, sort_keys=sort_keys, ensure_ascii=ensure_ascii) + "\n"
                                     for r in rows))


@contextmanager
def atomic_dir(path: str | Path) -> Iterator[Path]:
    """A fresh temporary folder beside `path`; when the block ends without an error it replaces the folder `path`.

    The temporary `.<name>.partial` is removed first if a killed run left it; an existing `path` is removed just
    before the rename (a reader sees the old folder, then briefly none, then the new one, never a partial one).

    Args:
        path: the destination folder (parent folders are created).

    Yields:
        The temporary folder, created empty.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        yield tmp
        if path.exists():
            shutil.rmtree(path)
        os.replace(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
