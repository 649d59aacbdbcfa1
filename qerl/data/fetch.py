"""Benchmark files for `qerl data` (qerl/commands/data.py): make sure every benchmark file a config needs exists, then write a manifest of what is there.

Why: the DAG's `data` rule must either provide ``<data.root>/<benchmark>/<split>.jsonl`` for every benchmark in
``data.benchmarks`` or stop at once with a message that says exactly which file to put where. When a file is
missing, ``data.download`` is true and the Hugging Face hub answers within a few seconds, the public dataset is
downloaded (with the `datasets` library) and converted to our JSONL fields (`qerl.data.convert`); otherwise nothing
is fetched. Every file, downloaded or already present, is then loaded through `qerl.data.benchmarks` (so a bad row
fails here, with ``file:line``) and listed in the manifest with its row count and sha256.

Run::

    qerl data --config config/small.yaml --out results/small/data/manifest.json

Hub sources (public dataset repos; the MATH training remainder is built, as in data/SOURCES.md, from the MATH test
set minus the 500 MATH-500 problems):

    gsm8k       openai/gsm8k (config main), train and test
    math500     HuggingFaceH4/MATH-500, test
    aime24      HuggingFaceH4/aime_2024, train (the 30 problems of AIME 2024 I and II)
    aime25      math-ai/aime25, test
    amc23       math-ai/amc23, test
    math_train  EleutherAI/hendrycks_math (7 subject configs), test, minus MATH-500

Offline: set ``HF_HUB_OFFLINE=1`` (or ``data.download: false``) and nothing touches the network.
Run the tests: ``pytest tests/data/test_fetch.py -q``.
"""
from __future__ import annotations

import hashlib
import os
import socket
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from qerl.data.benchmarks import (
    BENCHMARK_FIELDS,
    BENCHMARK_FILES,
    load_benchmark,
    missing_files,
    parse_row,
)
from qerl.data.convert import convert_competition, convert_gsm8k, convert_math500, convert_math_train
from qerl.io import write_json, write_jsonl

__all__ = [
    "HubSource",
    "HUB_SOURCES",
    "MATH_SUBJECTS",
    "HubRows",
    "provide",
    "hub_reachable",
    "hub_rows",
    "fetch_file",
    "file_sha256",
    "build_manifest",
    "missing_message",
]

#: (repo, config, split) -> rows; the real one is `hub_rows`, tests pass a fake.
HubRows = Callable[[str, "str | None", str], list[dict]]

#: the seven subject configs of the MATH dataset on the hub.
MATH_SUBJECTS = (
    "algebra",
    "counting_and_probability",
    "geometry",
    "intermediate_algebra",
    "number_theory",
    "prealgebra",
    "precalculus",
)


@dataclass(frozen=True)
class HubSource:
    """Where one of our files comes from on the hub.

    Attributes:
        benchmark: our benchmark name.
        split: our split name.
        repo: the public dataset repo id.
        config: the dataset config name (None for the default).
        hub_split: the split name in that repo.
    """

    benchmark: str
    split: str
    repo: str
    config: str | None
    hub_split: str


#: relative file path -> its hub source.
HUB_SOURCES: dict[str, HubSource] = {
    "gsm8k/train.jsonl": HubSource("gsm8k", "train", "openai/gsm8k", "main", "train"),
    "gsm8k/test.jsonl": HubSource("gsm8k", "test", "openai/gsm8k", "main", "test"),
    "math500/test.jsonl": HubSource("math500", "test", "HuggingFaceH4/MATH-500", None, "test"),
    "aime24/test.jsonl": HubSource("aime24", "test", "HuggingFaceH4/aime_2024", None, "train"),
    "aime25/test.jsonl": HubSource("aime25", "test", "math-ai/aime25", None, "test"),
    "amc23/test.jsonl": HubSource("amc23", "test", "math-ai/amc23", None, "test"),
    "math_train/train.jsonl": HubSource("math_train", "train", "EleutherAI/hendrycks_math", None, "test"),
}
assert set(HUB_SOURCES) == {rel for splits in BENCHMARK_FILES.values() for rel in splits.values()}

_TRUE = {"1", "true", "yes", "on"}


# --------------------------------------------------------------------------------------------------------------
# Network


def hub_reachable(timeout: float = 3.0) -> bool:
    """Whether the hub answers a TCP connection within `timeout` seconds; never hangs.

    ``HF_HUB_OFFLINE`` or ``HF_DATASETS_OFFLINE`` set to a true value means offline without trying. The endpoint
    is huggingface_hub's (``HF_ENDPOINT`` overrides it). Name resolution and connection run in a daemon thread
    that is abandoned after `timeout`, since DNS lookups ignore socket timeouts.

    Args:
        timeout: seconds to wait in total.

    Returns:
        True if a connection was made.
    """
    if any(os.environ.get(var, "").strip().lower() in _TRUE for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")):
        return False
    try:
        from urllib.parse import urlparse

        from huggingface_hub import constants

        parsed = urlparse(constants.ENDPOINT)
    except Exception:  # noqa: BLE001 - no hub client, no download
        return False
    host, port = parsed.hostname, parsed.port or (443 if parsed.scheme == "https" else 80)
    if not host:
        return False
    result: list[bool] = []

    def probe() -> None:
        try:
            with socket.create_connection((host, port), timeout=timeout):
                result.append(True)
        except OSError:
            result.append(False)

    thread = threading.Thread(target=probe, name="qerl-hub-probe", daemon=True)
    thread.start()
    thread.join(timeout)
    return bool(result and result[0])


def hub_rows(repo: str, config: str | None, split: str) -> list[dict]:
    """Download one split of a public hub dataset with `datasets` and return its rows as plain dicts.

    Args:
        repo: dataset repo id.
        config: config name or None.
        split: split name.

    Returns:
        The rows.
    """
    from datasets import load_dataset  # heavy; only imported when actually downloading

    dataset = load_dataset(repo, config, split=split)
    return [dict(row) for row in dataset]


# --------------------------------------------------------------------------------------------------------------
# Files


def file_sha256(path: str | Path) -> str:
    """Hex sha256 of a file's bytes.

    Args:
        path: the file.

    Returns:
        64 hex digits.
    """
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _validate(rows: list[dict], source: HubSource, origin: str) -> None:
    """Run every converted row through the loader's row check before anything is written."""
    if not rows:
        raise ValueError(f"{origin}: no rows after conversion")
    for i, row in enumerate(rows):
        parse_row(source.benchmark, row, f"{origin} row {i}", i, source.split)


def fetch_file(rel: str, root: str | Path, download: HubRows = hub_rows) -> dict:
    """Download and convert one of our files from its hub source, validate it, write it atomically.

    Args:
        rel: relative path, a key of ``HUB_SOURCES``.
        root: the data root.
        download: ``(repo, config, split) -> rows``; `hub_rows` by default.

    Returns:
        Provenance for the manifest: repo, config, split, rows dropped.

    Raises:
        ValueError: unknown file; a download that fails (naming the repo); converted rows that do not validate.
    """
    if rel not in HUB_SOURCES:
        raise ValueError(f"no hub source known for {rel!r}; known: {sorted(HUB_SOURCES)}")
    source = HUB_SOURCES[rel]
    origin = f"hub dataset {source.repo}" + (f" (config {source.config})" if source.config else "")
    origin += f" split {source.hub_split}"
    dropped = 0
    try:
        if source.benchmark == "gsm8k":
            rows = convert_gsm8k(download(source.repo, source.config, source.hub_split))
        elif source.benchmark == "math500":
            rows = convert_math500(download(source.repo, source.config, source.hub_split))
        elif source.benchmark in ("aime24", "aime25", "amc23"):
            rows = convert_competition(download(source.repo, source.config, source.hub_split))
        elif source.benchmark == "math_train":
            rows, dropped = convert_math_train(
                {s: download(source.repo, s, source.hub_split) for s in MATH_SUBJECTS},
                _math500_problems(root, download),
            )
        else:  # pragma: no cover - HUB_SOURCES drift
            raise AssertionError(source)
    except ValueError:
        raise
    except Exception as exc:  # noqa: BLE001 - network/library errors become one clear line
        raise ValueError(
            f"could not download {rel} from {origin}: {type(exc).__name__}: {exc}. "
            f"Put the file at {Path(root) / rel} yourself ({BENCHMARK_FIELDS[source.benchmark]})."
        ) from exc
    _validate(rows, source, origin)
    write_jsonl(Path(root) / rel, rows, ensure_ascii=False)
    return {"repo": source.repo, "config": source.config, "split": source.hub_split, "dropped_rows": dropped}


def _math500_problems(root: str | Path, download: HubRows) -> list[str]:
    """MATH-500's problem statements: from the local file when present, else from the hub."""
    local = Path(root) / BENCHMARK_FILES["math500"]["test"]
    if local.is_file():
        return [p.question for p in load_benchmark("math500", root)]
    source = HUB_SOURCES[BENCHMARK_FILES["math500"]["test"]]
    rows = download(source.repo, source.config, source.hub_split)
    return [r["problem"] for r in rows if isinstance(r.get("problem"), str)]


def missing_message(root: str | Path, missing: list[str], reason: str) -> str:
    """The error text for files that are missing and will not be downloaded: which file goes where.

    Args:
        root: the data root.
        missing: relative paths.
        reason: why nothing is downloaded (offline, download disabled).

    Returns:
        A multi-line message.
    """
    lines = [f"{len(missing)} benchmark file(s) missing under data.root = {str(root)!r} and {reason}. Put them here:"]
    for rel in missing:
        source = HUB_SOURCES[rel]
        lines.append(
            f"  {Path(root).resolve() / rel}  <- {source.benchmark} ({BENCHMARK_FIELDS[source.benchmark]}); "
            f"public source: hub dataset {source.repo}"
            + (f" config {source.config}" if source.config else "")
            + f" split {source.hub_split}"
            + (" minus the MATH-500 problems" if source.benchmark == "math_train" else "")
        )
    lines.append("then run `qerl data --config <config>` again (or run it online with data.download: true).")
    return "\n".join(lines)


def build_manifest(root: str | Path, names: list[str], provenance: dict[str, dict] | None = None) -> dict:
    """Load every file of the benchmarks `names` (validating each row) and describe it.

    Args:
        root: the data root.
        names: benchmark names.
        provenance: relative path -> download provenance, for files fetched in this run.

    Returns:
        ``{"root", "benchmarks", "files": {rel: {"benchmark", "split", "rows", "bytes", "sha256", "origin"}}}``.

    Raises:
        ValueError: a missing file or an invalid row (``file:line``).
    """
    provenance = provenance or {}
    files = {}
    for name in names:
        for split, rel in BENCHMARK_FILES[name].items():
            path = Path(root) / rel
            problems = load_benchmark(name, root, split)
            files[rel] = {
                "benchmark": name,
                "split": split,
                "rows": len(problems),
                "bytes": path.stat().st_size,
                "sha256": file_sha256(path),
                "origin": {"downloaded": provenance[rel]} if rel in provenance else "present",
            }
    return {"root": str(root), "benchmarks": list(names), "files": files}


def provide(config: str | Path, out: str | Path | None = None, timeout_s: float = 3.0, download: HubRows = hub_rows,
            reachable: Callable[[float], bool] = hub_reachable) -> dict:
    """Provide every benchmark file the config needs, then write the manifest.

    Args:
        config: the config file (data.root, data.benchmarks, data.download).
        out: write the manifest (rows, sha256 per file) to this JSON path, when given.
        timeout_s: seconds to wait for the hub before treating it as offline.
        download: the hub downloader (tests pass a fake).
        reachable: the online check (tests pass a fake).

    Returns:
        The manifest (build_manifest).

    Raises:
        ValueError: bad config; missing files that cannot be downloaded (listing each file and where it goes);
            a failed download; an invalid row in any file.
    """
    from qerl.config import load_config

    cfg = load_config(config, check_data=False)
    data = cfg["data"]
    root, names = data["root"], list(data["benchmarks"])
    missing = missing_files(root, names)
    provenance: dict[str, dict] = {}
    if missing:
        if not data["download"]:
            raise ValueError(f"{config}: " + missing_message(root, missing, "data.download is false"))
        if not reachable(timeout_s):
            raise ValueError(
                f"{config}: "
                + missing_message(root, missing, "the hub is not reachable (offline, or HF_HUB_OFFLINE is set)")
            )
        for rel in missing:
            print(f"qerl data: downloading {rel} from hub dataset {HUB_SOURCES[rel].repo}", flush=True)
            provenance[rel] = fetch_file(rel, root, download)
    manifest = build_manifest(root, names, provenance)
    if out:
        write_json(out, manifest, sort_keys=True)
    return manifest
