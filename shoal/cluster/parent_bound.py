"""Runs a command that dies with the process that started it: `python -m
shoal.cluster.parent_bound PID CMD ARGS...` asks Linux to SIGKILL it when its parent dies
(PR_SET_PDEATHSIG, kept across exec), then becomes CMD.

A local cluster's etcd and nodes are started this way, so `shoal generate` (or `up`,
`embed`, `rag`) killed by any signal, SIGKILL included, leaves no orphans behind. A
parent that exits normally stops its cluster gracefully first; this is for a parent that
could not, so the nodes get no graceful exit either (a SIGTERM could leave one waiting
on an etcd that died with it): every node survives kill -9 by design.
Setting the flag here, after the fork, rather than in a `preexec_fn` keeps the parent
free of the fork-with-threads hazards of the latter. Elsewhere than Linux it just runs
CMD.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1


def bind_to_parent(parent: int) -> None:
    """SIGKILL when `parent` dies; exits now if it already has."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != parent:  # it died before the flag was set
        raise SystemExit(1)


def command(argv: list[str]) -> list[str]:
    """`argv` wrapped to die with this process."""
    return [sys.executable, "-m", "shoal.cluster.parent_bound", str(os.getpid()), *argv]


if __name__ == "__main__":
    bind_to_parent(int(sys.argv[1]))
    os.execvp(sys.argv[2], sys.argv[2:])
