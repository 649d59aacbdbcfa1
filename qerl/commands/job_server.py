"""`qerl job-server SOCKET PARENT_PID`: serve `qerl` commands from one preloaded process (qerl/jobserver.py says why
and how). The Snakefile starts it when a run starts (`resources.job_server`, qerl.jobserver.start) and stops it when
the run ends; it is not meant to be run by hand.
"""
from __future__ import annotations

from qerl.args import add_list

__all__ = ["add_arguments", "run"]


def add_arguments(parser) -> None:
    """Arguments of `qerl job-server`."""
    parser.add_argument("socket", help="the Unix socket to listen on (its removal stops the server)")
    parser.add_argument("parent", type=int, help="the process id the server ends with (Snakemake's)")
    add_list(parser, "--preload", default=None, help="modules to import before serving (default: "
                                                     "qerl.jobserver.PRELOAD)")


def run(args) -> int:
    """Serve until the socket is removed or the parent is gone; exit status 0."""
    from qerl.cli import main
    from qerl.jobserver import PRELOAD, serve

    serve(args.socket, args.parent, main, tuple(args.preload) if args.preload else PRELOAD)
    return 0
