"""The job server (qerl/jobserver.py): a `qerl` command handed to it prints, writes and exits as the same command run
in its own interpreter; a client that is killed takes its command with it; without a server `qerl` runs the command
itself; the server ends when its socket is removed or its parent is gone. The servers here preload qerl.config
only (seconds, not the stages' ~7 s of imports); the DAG tests run the real one (the tiny config turns it on)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from qerl import jobserver

QERL = str(Path(sys.executable).with_name("qerl"))


def _wait(condition, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


@pytest.fixture
def server(tmp_path):
    """A job server for this test process (preloading qerl.config), its socket path once it listens."""
    path = jobserver.start(os.getpid(), log=tmp_path / "server.log", preload=("qerl.config",))
    _wait(lambda: os.path.exists(path))
    yield path
    jobserver.stop(path)


def _qerl(args, env_path=None, **kwargs):
    env = {k: v for k, v in os.environ.items() if k != jobserver.ENV_VAR}
    if env_path:
        env[jobserver.ENV_VAR] = env_path
    return subprocess.run([QERL, *args], capture_output=True, text=True, env=env, timeout=120, **kwargs)


def _server_children(path: str) -> list[int]:
    """Process ids whose parent is the server listening on `path`."""
    server = next(int(p) for p in os.listdir("/proc") if p.isdigit() and path.encode() in _cmdline(p))
    return [int(p) for p in os.listdir("/proc") if p.isdigit() and _ppid(p) == server]


def _cmdline(pid: str) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def _ppid(pid: str) -> int | None:
    try:
        return int(next(line for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                        if line.startswith("PPid:")).split()[1])
    except (OSError, StopIteration):
        return None


def test_a_command_through_the_server_is_the_command(server, tmp_path, repo_root):
    """Output, files, exit status, working directory (a relative --out), environment and stderr as in-process."""
    cfg = yaml.safe_load((repo_root / "config" / "config.yaml").read_text())
    cfg["data"]["tiny"].update(n_pretrain=300, n_rl=50, n_test_per_level=2)
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cfg))
    runs = {}
    for name, env_path in (("alone", None), ("served", server)):
        (tmp_path / name).mkdir()
        runs[name] = _qerl(["gen-tiny", "--config", "../c.yaml", "--out", "data"], env_path, cwd=tmp_path / name)
    assert runs["alone"].returncode == runs["served"].returncode == 0, runs["served"].stderr
    assert runs["served"].stdout == runs["alone"].stdout and json.loads(runs["served"].stdout)["pretrain"] == 300
    for split in ("pretrain", "rl", "test"):
        assert ((tmp_path / "served" / "data" / f"{split}.jsonl").read_bytes()
                == (tmp_path / "alone" / "data" / f"{split}.jsonl").read_bytes())
    bad = _qerl(["check-config", "--config", str(tmp_path / "missing.yaml")], server)
    assert bad.returncode == 2 and "missing.yaml" in bad.stderr and not bad.stdout


def test_without_a_server_qerl_runs_the_command_itself(tmp_path, monkeypatch):
    monkeypatch.delenv(jobserver.ENV_VAR, raising=False)
    assert jobserver.forward(["--help"]) is None
    monkeypatch.setenv(jobserver.ENV_VAR, str(tmp_path / "gone.sock"))
    assert jobserver.forward(["--help"]) is None
    done = _qerl(["--help"], str(tmp_path / "gone.sock"))
    assert done.returncode == 0 and "gen-tiny" in done.stdout


def test_a_client_waits_for_a_server_still_importing_and_not_for_one_that_failed(tmp_path, monkeypatch):
    """A `qerl` started while its server imports is served by it once it listens (the jobs a DAG starts in its first
    seconds would otherwise pay the same imports beside the server's); a server that dies importing is not waited
    for: the client runs the command itself at once."""
    (tmp_path / "slow_import.py").write_text("import time\ntime.sleep(2.0)\n")  # imports still running when asked
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (str(tmp_path), os.environ.get("PYTHONPATH")) if p))
    path = jobserver.start(os.getpid(), log=tmp_path / "server.log", preload=("qerl.config", "slow_import"))
    try:
        monkeypatch.setenv(jobserver.ENV_VAR, path)
        assert not os.path.exists(path)  # not listening yet
        assert jobserver.forward(["check-config", "--config", str(tmp_path / "missing.yaml")]) == 2  # served
    finally:
        jobserver.stop(path)
    path = jobserver.start(os.getpid(), log=tmp_path / "failed.log", preload=("qerl.config", "no_such_module_here"))
    try:
        monkeypatch.setenv(jobserver.ENV_VAR, path)
        start = time.monotonic()
        assert jobserver.forward(["--help"]) is None
        assert time.monotonic() - start < jobserver.START_WAIT_S / 2
        _wait(lambda: "no_such_module_here" in (tmp_path / "failed.log").read_text())  # it did fail
    finally:
        jobserver.stop(path)
    path = jobserver.start(os.getpid(), log=tmp_path / "killed.log", preload=("qerl.config", "slow_import"))
    try:  # killed while importing: its marker stays, its process is gone (a zombie until its parent reaps it)
        os.kill(int((Path(path).parent / "starting.pid").read_text()), signal.SIGKILL)
        monkeypatch.setenv(jobserver.ENV_VAR, path)
        start = time.monotonic()
        assert jobserver.forward(["--help"]) is None
        assert time.monotonic() - start < jobserver.START_WAIT_S / 2
    finally:
        jobserver.stop(path)


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_a_killed_client_takes_its_command_with_it(server, tmp_path, repo_root, sig):
    cfg = yaml.safe_load((repo_root / "config" / "config.yaml").read_text())
    cfg["data"]["tiny"]["n_pretrain"] = 5_000_000  # minutes of generating: still running when the client is killed
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cfg))
    env = {**os.environ, jobserver.ENV_VAR: server}
    client = subprocess.Popen([QERL, "gen-tiny", "--config", str(tmp_path / "c.yaml"), "--out", str(tmp_path / "d")],
                              env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _wait(lambda: len(_server_children(server)) == 1)
    client.send_signal(sig)
    assert client.wait(timeout=30) != 0
    _wait(lambda: not _server_children(server), timeout=30)


def test_the_server_ends_with_its_socket_or_its_parent(tmp_path):
    parent = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        path = jobserver.start(parent.pid, preload=("qerl.config",))
        _wait(lambda: os.path.exists(path))
        parent.kill()
        parent.wait()
        _wait(lambda: not os.path.exists(os.path.dirname(path)), timeout=30)  # socket and folder removed
    finally:
        parent.kill()
    path = jobserver.start(os.getpid(), preload=("qerl.config",))
    _wait(lambda: os.path.exists(path))
    jobserver.stop(path)
    _wait(lambda: not any(path.encode() in _cmdline(p) for p in os.listdir("/proc") if p.isdigit()), timeout=30)
