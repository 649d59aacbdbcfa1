"""Provenance stamped on every output: which config, commit and hardware made it.

    from qerl.provenance import provenance
    json.dump({"result": ..., "provenance": provenance(config_path)}, f)
"""
from __future__ import annotations

import datetime
import hashlib
import os
import platform
import subprocess
import sys
from pathlib import Path

__all__ = ["git_commit", "hardware", "provenance"]

_REPO = Path(__file__).resolve().parents[1]


def git_commit(repo: Path = _REPO) -> str:
    """`<sha>` of HEAD, with `-dirty` when tracked files differ from it; "unknown" outside a git checkout."""
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True, timeout=10,
                             check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=repo,
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return sha + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def hardware() -> dict:
    """CPU model and core count, and the GPU name, driver-visible CUDA version and count when torch sees one."""
    info = {"cpu": _cpu_name(), "cpu_count": os.cpu_count(), "platform": platform.platform()}
    try:
        import torch

        info["torch"] = torch.__version__
        if torch.cuda.is_available():
            info["gpu"] = torch.cuda.get_device_name(0)
            info["gpu_count"] = torch.cuda.device_count()
            info["cuda"] = torch.version.cuda
    except ImportError:  # pragma: no cover
        pass
    return info


def provenance(config_path: str | Path | None = None) -> dict:
    """Commit, time, command line, hardware and (if given) the config file's path and sha256."""
    out = {
        "commit": git_commit(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join(sys.argv),
        "python": platform.python_version(),
        "hardware": hardware(),
    }
    if config_path is not None:
        data = Path(config_path).read_bytes()
        out["config"] = {"path": str(config_path), "sha256": hashlib.sha256(data).hexdigest()}
    return out
