"""Starting a node as its own process and reading the address it bound."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

MODULES = {"storage": "shoal.nodes.storage.storage_node", "worker": "shoal.nodes.worker.worker_node",
           "scheduler": "shoal.nodes.scheduler_node", "router": "shoal.nodes.router",
           "simhost": "shoal.nodes.sim_worker_host"}  # simhost: simulated workers (benchmarks)


# The environment of a node that is not a worker but shares a host's cores with workers:
# one BLAS / OpenMP thread. At their defaults an index search's BLAS threads spin on
# every core after each call and stall the workers' OpenMP teams (measured: W3 through a
# local cluster 20% slower than the same work in one process).
SHARED_CORE_ENV = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def spawn_node(role: str, name: str, args: list[str], log_dir: Path, env: dict | None = None,
               prefix: list[str] | None = None, die_with_parent: bool = False,
               beside_workers: bool = False, timeout: float | None = None) -> tuple[subprocess.Popen, str]:
    """Starts `shoal node ROLE` in a fresh interpreter (never a fork of this one) with its
    log in log_dir/NAME.log and `env` added to this environment; returns the process
    and the address it serves on. `prefix` wraps the command (e.g. `ip netns exec NS`
    to run the node on a host of its own); `die_with_parent` ends the node when this
    process ends, however it ends (`parent_bound.py`); `beside_workers`: the host also
    runs workers, so a node of another role gets SHARED_CORE_ENV under `env`. `timeout`:
    seconds to wait for the address (a worker prints it once its models are loaded and
    calibrated), after which the node is killed and RuntimeError names its log; None:
    no limit."""
    import os

    from shoal.cluster.parent_bound import command

    if beside_workers and role != "worker":
        env = {**SHARED_CORE_ENV, **(env or {})}

    # -P (safe path): the current folder is not put first on sys.path, so a `shoal/`
    # folder where the node is started never shadows the installed package.
    cmd = [sys.executable, "-P", "-m", MODULES[role], *args]
    log_dir.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen([*(prefix or []), *(command(cmd) if die_with_parent else cmd)], stdout=subprocess.PIPE,
                            stderr=open(log_dir / f"{name}.log", "ab"), text=True, start_new_session=True,
                            env={**os.environ, **env} if env else None)
    line = _first_line(proc, timeout)
    if line is None:
        import signal

        try:
            os.killpg(proc.pid, signal.SIGKILL)  # its own session: the node and any wrapper
        except ProcessLookupError:
            pass
        proc.wait()
        log = log_dir / f"{name}.log"
        raise RuntimeError(f"{name} did not start within {max(0.0, timeout):.0f} s: killed; its last line: "
                           f"{last_error_line(log) or 'nothing logged'} (log: {log})")
    if not line.startswith(f"{role}:"):
        try:
            proc.wait(5)  # it is exiting: let it finish writing its log
        except subprocess.TimeoutExpired:
            proc.kill()
        log = log_dir / f"{name}.log"
        raise RuntimeError(f"{name} did not start: {last_error_line(log) or line or 'no reason logged'} (log: {log})")
    return proc, line.split(" ", 1)[1]


def _first_line(proc: subprocess.Popen, timeout: float | None) -> str | None:
    """The node's first line on stdout (empty if it exited first), or None if none came
    within `timeout` seconds."""
    if timeout is not None:
        import select

        ready, _, _ = select.select([proc.stdout], [], [], max(0.0, timeout))
        if not ready:
            return None
    return proc.stdout.readline().strip()  # (the node writes its line whole, then flushes)


def last_error_line(log: Path) -> str:
    """The reason a node gave for dying: the last line of its log's final traceback
    (the exception), or else its last line."""
    try:
        lines = [ln.strip() for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    if not lines:
        return ""
    for i in range(len(lines) - 1, -1, -1):
        if lines[i].startswith("Traceback (most recent call last)"):
            tail = [ln for ln in lines[i + 1:] if not ln.startswith(("File ", "^", "~"))]
            return tail[-1] if tail else lines[-1]
    return lines[-1]


def terminate_pids(pids: list[int]) -> int:
    """SIGTERM to each process still alive; returns how many were signalled."""
    import os
    import signal

    n = 0
    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM)
            n += 1
        except ProcessLookupError:
            pass
    return n
