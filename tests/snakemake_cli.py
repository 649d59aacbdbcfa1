"""`snakemake ARGS` for the tests, run in a fork of one process per test worker that has Snakemake imported.

Why: the suite runs Snakemake ~30 times (dry runs, lint, small DAGs; all but workflow/resume.sh's runs and one run
that is killed come through here), and each `snakemake` process first imports Snakemake and its plugins (~1.3
CPU-seconds on a 2-core Xeon) before it reads the Snakefile. Here a multiprocessing fork server imports
`snakemake.cli` and the Snakefile's `qerl.config` once (a fresh interpreter, not a copy of the test process), and
each call forks it and runs Snakemake's own command line, `snakemake.cli.main`, in the child: its own process with
the given arguments, working directory and environment, stdout and stderr captured, stdin empty, and Snakemake's
exit status, as `subprocess.run([snakemake, *args], ...)` gives them.

    proc = snakemake(["-n", "--configfile", path], cwd=repo_root, env=ENV, timeout=300)   # a CompletedProcess
"""
from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
import tempfile
from pathlib import Path

__all__ = ["snakemake"]

SNAKEMAKE = str(Path(sys.executable).with_name("snakemake"))
_CONTEXT = multiprocessing.get_context("forkserver")
_CONTEXT.set_forkserver_preload(["snakemake.cli", "qerl.config"])


def snakemake(args: list[str], *, env: dict[str, str], cwd: str | Path | None = None,
              timeout: float = 300) -> subprocess.CompletedProcess:
    """Run Snakemake's command line with `args` in directory `cwd` (default: this one) and environment `env`.

    Returns:
        The CompletedProcess of `[SNAKEMAKE, *args]`: its return code (negative: killed by that signal) and its
        stdout and stderr as text.

    Raises:
        subprocess.TimeoutExpired: it ran longer than `timeout` seconds (it is killed).
    """
    argv = [SNAKEMAKE, *map(str, args)]
    with tempfile.TemporaryDirectory(prefix="snakemake-cli-") as folder:
        out, err = Path(folder, "stdout"), Path(folder, "stderr")
        out.touch()
        err.touch()
        child = _CONTEXT.Process(target=_main, args=(argv, str(cwd or os.getcwd()), dict(env), str(out), str(err)))
        child.start()
        child.join(timeout)
        if child.exitcode is None:
            child.kill()
            child.join()
            raise subprocess.TimeoutExpired(argv, timeout)
        return subprocess.CompletedProcess(argv, child.exitcode, out.read_text(), err.read_text())


def _main(argv: list[str], cwd: str, env: dict[str, str], out: str, err: str) -> None:
    """The child: take the directory, environment, arguments and output files, then run Snakemake (it exits)."""
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    for path, fd in ((out, 1), (err, 2)):
        target = os.open(path, os.O_WRONLY)
        os.dup2(target, fd)
        os.close(target)
    sys.argv = argv
    from snakemake.cli import main
    from snakemake.workflow import Workflow

    Workflow._rundir = os.getcwd()  # what Snakemake logs as its run directory, read when it is imported
    main()
