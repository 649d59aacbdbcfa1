"""workflow/with_mps.sh: the small DAG under CUDA's multi-process service where a daemon can start, as it is where not.

The daemon and its client check are replaced by stand-ins on PATH (this machine has no GPU): what is tested is the
wrapper's logic — the command sees the daemon's pipe folder only when the daemon started and a client reached it, the
daemon is stopped after the command, and the command's exit status is the wrapper's.
"""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "workflow" / "with_mps.sh"
PROBE = 'echo "pipe=${CUDA_MPS_PIPE_DIRECTORY:-none}"; exit 3'


def _fake_bin(tmp_path: Path, client_ok: bool) -> Path:
    """A bin folder with a stand-in nvidia-cuda-mps-control (records its arguments and stdin) and a stand-in Python
    whose client check succeeds or fails."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    control = bin_dir / "nvidia-cuda-mps-control"
    control.write_text(f'#!/bin/bash\nif [ "$1" = -d ]; then echo start >> {tmp_path}/calls; '
                       f'touch "$CUDA_MPS_PIPE_DIRECTORY/control"; '
                       f'else echo "stdin $(cat)" >> {tmp_path}/calls; fi\n')
    python = bin_dir / "fake-python"
    python.write_text(f"#!/bin/bash\nexit {0 if client_ok else 1}\n")
    for f in (control, python):
        f.chmod(0o755)
    return bin_dir


def _run(tmp_path: Path, bin_dir: Path | None) -> subprocess.CompletedProcess:
    env = {**os.environ, "QERL_MPS_DIR": str(tmp_path / "mps")}
    env["PATH"] = f"{bin_dir}:/usr/bin:/bin" if bin_dir else "/usr/bin:/bin"
    if bin_dir:
        env["QERL_PYTHON"] = str(bin_dir / "fake-python")
    env.pop("CUDA_MPS_PIPE_DIRECTORY", None)
    return subprocess.run(["bash", str(SCRIPT), "bash", "-c", PROBE], env=env, capture_output=True, text=True,
                          timeout=30)


def test_runs_the_command_as_it_is_without_a_daemon(tmp_path):
    r = _run(tmp_path, None)
    assert r.returncode == 3
    assert r.stdout.strip() == "pipe=none"
    assert "MPS unavailable" in r.stderr


def test_runs_under_the_daemon_and_stops_it_after(tmp_path):
    r = _run(tmp_path, _fake_bin(tmp_path, client_ok=True))
    assert r.returncode == 3
    assert r.stdout.strip() == f"pipe={tmp_path / 'mps' / 'pipe'}"
    assert "MPS on" in r.stderr
    assert (tmp_path / "calls").read_text().split("\n")[:2] == ["start", "stdin quit"]


def test_a_daemon_no_client_reaches_is_stopped_and_the_command_runs_without_it(tmp_path):
    r = _run(tmp_path, _fake_bin(tmp_path, client_ok=False))
    assert r.returncode == 3
    assert r.stdout.strip() == "pipe=none"
    assert "MPS unavailable" in r.stderr
    assert (tmp_path / "calls").read_text().split("\n")[:2] == ["start", "stdin quit"]


def test_no_command_is_a_usage_error():
    r = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and "usage" in r.stderr
