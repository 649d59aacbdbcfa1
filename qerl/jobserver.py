"""A preloaded `qerl` for the DAG's CPU jobs: one server process imports torch, transformers, peft, lm-eval and the
stages once, and forks a child per `qerl` command; the command line a job runs stays `qerl <subcommand> ...`.

Why: a tiny-scale job is seconds of work behind ~6-8 CPU-seconds of imports (torch 1.3, transformers with the Qwen2
model 2.8, peft with bitsandbytes 1.3, lm-eval 0.7, on a 2-core Xeon). Measured: 146 of the default DAG's ~890
job-seconds were imports, and 155 of the ~210 CPU-seconds of the test suite's trimmed DAG. A forked child starts with
all of it imported. Each command still runs as its own process with its own state, exactly as `qerl ...` does:
the same arguments, working directory, environment, stdin/stdout/stderr (its log), exit status; its torch threads
from OMP_NUM_THREADS as at start-up; and every stage seeds its own randomness (the DAG's outputs are the same with
or without the server, file for file: tests/tools/compare_results.py).

How: `qerl` (qerl.cli.main, called as the console script) looks for the socket named by $QERL_JOB_SERVER; when it
answers, the client sends its arguments, directory and environment and passes its three file descriptors
(SCM_RIGHTS), then waits for the exit status, forwarding SIGINT / SIGTERM / SIGHUP to the child. A server still
importing (its start marker beside the socket path names its running process) is waited for, up to START_WAIT_S:
the jobs a run starts in its first seconds (the renders that need no results, gen-tiny, the serial pretraining)
would otherwise each pay the same imports beside the server's, on the same two cores (the tiny DAG's pretraining
started its loop ~5 s later for it, and the test suite's Snakemake runs paid ~20 CPU-seconds). Without the
variable, with no server listening or starting, or with one that died starting, `qerl` runs the command itself,
as always. The server forks before anything
of a command runs (it never runs a torch op, so no OpenMP pool exists to break in the child, the case PyTorch's own
fork-based DataLoader workers rely on); a child whose client goes away (a job killed, even with SIGKILL) kills
itself. The server ends when its socket file is removed (`stop`) or its parent (Snakemake) is gone.

Where: the Snakefile starts one per run when `resources.job_server` is on (the tiny scale; workflow/rules/config.smk)
and stops it when the run ends. Off elsewhere: Snakemake's `benchmark:` files then record the client's memory and
CPU time, not the job's (wall seconds stay right), and qerl.profiling.stage_costs reads those at the small and
paper scales; GPU jobs gain nothing from it.

    qerl job-server SOCKET PARENT_PID [--preload MODULE ...]    # serve (what `start` launches)
"""
from __future__ import annotations

import importlib
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path
from typing import Callable

__all__ = ["ENV_VAR", "PRELOAD", "START_WAIT_S", "forward", "serve", "start", "stop"]

ENV_VAR = "QERL_JOB_SERVER"
# How long a client waits for a server still importing (~8 s on an idle Xeon core; a cap, not a pause: the client
# goes on as soon as the socket appears or the server's process is gone)
START_WAIT_S = 120.0
_STARTING = "starting.pid"  # beside the socket while the server imports: its process id
# What the stages import, heaviest first; the qerl modules pull in the rest (formats, layers, policy, rl, evaluate).
# The last line is what every command, or every training, evaluation or figure, imported on first use in its child
# (40-190 modules a job: the config schema's jsonschema, the policy and NF4 baseline modules, the PDF backend's
# fontTools): 0.1-0.2 s less per figure or table job on the 2-core Xeon.
PRELOAD = ("torch", "transformers", "transformers.models.qwen2.modeling_qwen2", "transformers.models.llama.modeling_llama",
           "peft", "lm_eval.evaluator", "math_verify", "matplotlib.pyplot", "qerl.evaluate.run", "qerl.rl.trainer",
           "qerl.models.pretrain", "qerl.quantize.stage", "qerl.report.registry",
           "qerl.config", "qerl.policy", "baselines.nf4", "matplotlib.backends.backend_pdf", "fontTools.subset")
_FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
_STATUS = struct.Struct("!i")


# ---- client (no import beyond the standard library: `qerl --help` stays fast) ----------------------------------------
def forward(argv: list[str]) -> int | None:
    """Run `qerl argv` in a child of the job server named by $QERL_JOB_SERVER; its exit status, or None when there is
    no server to take it (the caller then runs the command itself)."""
    path = os.environ.get(ENV_VAR)
    if not path or not (os.path.exists(path) or _wait_for_start(path)):
        return None
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(path)
    except OSError:  # a server that is gone or stopping
        conn.close()
        return None
    payload = json.dumps({"argv": [sys.argv[0], *argv], "cwd": os.getcwd(), "env": dict(os.environ)}).encode()
    socket.send_fds(conn, [struct.pack("!I", len(payload)) + payload], [0, 1, 2])
    pid = _read_status(conn)
    if pid is None:
        print(f"qerl: the job server at {path} did not start the command", file=sys.stderr)
        return 1

    def relay(signum, frame):  # a job stopped by Snakemake stops its child too
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass

    for signum in _FORWARDED:
        signal.signal(signum, relay)
    status = _read_status(conn)
    conn.close()
    if status is None:
        print(f"qerl: the job server's child {pid} ended without an exit status (killed?)", file=sys.stderr)
        return 1
    return status


def _wait_for_start(path: str, timeout: float = START_WAIT_S) -> bool:
    """Whether the socket `path` appears while its server's start marker names a running process (at most
    `timeout` seconds); False at once when there is no marker (no server, or one stopped)."""
    deadline = time.monotonic() + timeout
    while not os.path.exists(path) and time.monotonic() < deadline:
        try:
            pid = int(Path(_marker(path)).read_text())
        except (OSError, ValueError):  # no marker: listening by now, or never started / stopped
            break
        if not _running(pid):  # died while importing (its marker left behind)
            break
        time.sleep(0.05)
    return os.path.exists(path)


def _marker(path: str) -> str:
    """The start marker of the server of socket `path` (beside it; its process id while it imports)."""
    return os.path.join(os.path.dirname(path), _STARTING)


def _running(pid: int) -> bool:
    """A live process, not a zombie (a server that died is not reaped by Snakemake right away)."""
    if not _alive(pid):
        return False
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):  # no /proc (not Linux): a live pid is enough
        return True


def _read_status(conn: socket.socket) -> int | None:
    data = b""
    while len(data) < _STATUS.size:
        chunk = conn.recv(_STATUS.size - len(data))
        if not chunk:
            return None
        data += chunk
    return _STATUS.unpack(data)[0]


# ---- server ---------------------------------------------------------------------------------------------------------
def serve(path: str, parent: int, run: Callable[[list[str]], int], preload: tuple[str, ...] = PRELOAD) -> None:
    """Import `preload`, then fork a child per connection on the Unix socket `path`, which runs `run(arguments)`
    (qerl.cli.main: `qerl job-server`, qerl/commands/job_server.py, passes it), until the file is removed or process
    `parent` is gone. The socket appears only once the imports are done (bound under a temporary name, then
    renamed), and the start marker that `start` wrote goes then, or when the server fails before it listens: a
    client waits for a server still importing, never for one that cannot serve."""
    try:
        for name in preload:
            importlib.import_module(name)
        if threading.active_count() != 1:  # a Python thread would be missing in every child
            raise RuntimeError(f"job server: {threading.active_count()} Python threads after the imports; not serving")
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        staging = f"{path}.{os.getpid()}"
        listener.bind(staging)
        listener.listen(16)
        listener.settimeout(1.0)
        os.replace(staging, path)
    finally:
        _unlink(_marker(path))
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children are reaped by the kernel
    try:
        while os.path.exists(path) and _alive(parent):
            try:
                conn, _ = listener.accept()
            except socket.timeout:
                continue
            sys.stdout.flush()
            sys.stderr.flush()
            if os.fork() == 0:
                listener.close()
                _child(conn, run)  # never returns
            conn.close()
    finally:
        listener.close()
        stop(path)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _child(conn: socket.socket, run: Callable[[list[str]], int]) -> None:
    """One command in a forked child: take over the client's descriptors, directory, environment and arguments, run
    it, send the exit status, exit."""
    code = 1
    try:
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # the command's own subprocesses (git) are waited for
        for signum in _FORWARDED:
            signal.signal(signum, signal.SIG_DFL)
        head, fds, _, _ = socket.recv_fds(conn, 4, 3)
        size = struct.unpack("!I", head)[0]
        body = b""
        while len(body) < size:
            chunk = conn.recv(size - len(body))
            if not chunk:
                os._exit(1)
            body += chunk
        request = json.loads(body)
        for fd, target in zip(fds, (0, 1, 2)):
            os.dup2(fd, target)
            os.close(fd)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        sys.argv = request["argv"]
        threads = os.environ.get("OMP_NUM_THREADS", "")
        if threads.isdigit() and int(threads) > 0:  # what torch reads from the environment at start-up
            import torch

            torch.set_num_threads(int(threads))
        conn.sendall(_STATUS.pack(os.getpid()))
        done = threading.Event()
        threading.Thread(target=_die_with_client, args=(conn, done), daemon=True).start()
        try:
            code = int(run(sys.argv[1:]) or 0)
        except SystemExit as exc:  # as the interpreter does: None -> 0, an int as it is, anything else printed -> 1
            if exc.code is None or isinstance(exc.code, int):
                code = exc.code or 0
            else:
                print(exc.code, file=sys.stderr)
                code = 1
        except BaseException:
            traceback.print_exc()
            code = 1
        sys.stdout.flush()
        sys.stderr.flush()
        done.set()
        conn.sendall(_STATUS.pack(code))
    finally:
        os._exit(code)


def _die_with_client(conn: socket.socket, done: threading.Event) -> None:
    """The client sends nothing after its request: end of stream before the command is done means the client is
    gone (its job killed, even with SIGKILL), and so is the command."""
    try:
        while conn.recv(1):
            pass
    except OSError:
        pass
    if not done.is_set():
        os.kill(os.getpid(), signal.SIGKILL)


# ---- lifecycle (the Snakefile's onstart / onsuccess / onerror) -------------------------------------------------------
def start(parent: int, log: str | Path | None = None, preload: tuple[str, ...] | None = None) -> str:
    """Launch a server for process `parent` (it ends with it) and return its socket path, for $QERL_JOB_SERVER.

    The socket lives in a fresh temporary folder (a Unix socket path is limited to ~100 characters); the server's
    own output goes to `log` (default: discarded); `preload` replaces PRELOAD (tests)."""
    path = os.path.join(tempfile.mkdtemp(prefix="qerl-jobs-"), "server.sock")
    out = open(log, "ab") if log else subprocess.DEVNULL
    env = {k: v for k, v in os.environ.items() if k != ENV_VAR}
    server = subprocess.Popen([sys.executable, "-m", "qerl.cli", "job-server", path, str(parent),
                               *(["--preload", *preload] if preload else [])],
                              stdin=subprocess.DEVNULL, stdout=out, stderr=out, env=env, start_new_session=True)
    if log:
        out.close()
    # the start marker (serve removes it once listening, or on failing): clients started before then wait for it
    marker = _marker(path)
    Path(f"{marker}.tmp").write_text(str(server.pid))
    os.replace(f"{marker}.tmp", marker)
    return path


def stop(path: str | None) -> None:
    """Stop the server of `path` (it exits within a second of its socket file going) and remove its folder."""
    if not path:
        return
    _unlink(path)
    _unlink(_marker(path))
    try:
        os.rmdir(os.path.dirname(path))
    except OSError:  # gone already; or the folder still holds the socket of a server not yet listening
        pass


def _unlink(path: str) -> None:
    """Remove the file `path` if it is there."""
    try:
        os.unlink(path)
    except OSError:
        pass

