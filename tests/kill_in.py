"""Run a `qerl` command line with one library function replaced by a SIGKILL of this process (a real kill, placed
at a known point rather than after a time).

    python tests/kill_in.py MODULE:FUNCTION N PIDFILE qerl-arguments...

The first N calls of MODULE.FUNCTION go through; the next one kills the process whose id PIDFILE holds (when
PIDFILE is not "-", e.g. the snakemake running this job), then this process. Used by the resume tests.
"""
import importlib
import os
import signal
import sys

target, after, pidfile = sys.argv[1], int(sys.argv[2]), sys.argv[3]
module_name, name = target.split(":")
module = importlib.import_module(module_name)
real, calls = getattr(module, name), []


def killing(*args, **kwargs):
    calls.append(1)
    if len(calls) > after:
        if pidfile != "-":
            with open(pidfile) as f:
                os.kill(int(f.read()), signal.SIGKILL)
        os.kill(os.getpid(), signal.SIGKILL)
    return real(*args, **kwargs)


setattr(module, name, killing)
from qerl.cli import main  # noqa: E402 - after the patch, as the command imports it

sys.exit(main(sys.argv[4:]))
