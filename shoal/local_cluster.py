"""A whole Shoal cluster on this machine: etcd and every node as its own process.

    with shoal.LocalCluster(model="model-dir", workers=2) as cluster:
        job = shoal.Client(cluster.router).submit(items)

`shoal up` runs one in the foreground. Each node's log goes to STATE_DIR/logs/.
"""

from __future__ import annotations

import subprocess
import tempfile
import time
from pathlib import Path

from shoal.etcd_server import EtcdServer
from shoal.node_process import spawn_node, terminate_pids


class LocalCluster:
    def __init__(self, model: str | Path, workers: int = 1, state_dir: str | Path | None = None,
                 cluster: str = "local", dtype: str = "float32", policy: str = "ebplus", worker_threads: int | None = None):
        self.model, self.workers, self.cluster, self.dtype, self.policy = str(model), workers, cluster, dtype, policy
        self.worker_threads = worker_threads
        self.dir = Path(state_dir or tempfile.mkdtemp(prefix="shoal-"))
        self.procs: list[subprocess.Popen] = []
        self.etcd: EtcdServer | None = None
        self.router = ""

    def _spawn(self, name: str, args: list[str]) -> str:
        proc, address = spawn_node(name.split("-")[0], name, args[1:], self.dir / "logs")
        self.procs.append(proc)
        return address

    def start(self, timeout: float = 600) -> "LocalCluster":
        try:
            self.etcd = EtcdServer(self.dir / "etcd").start()
            e = ["--etcd", self.etcd.endpoint, "--cluster", self.cluster]
            self._spawn("storage", ["shoal.nodes.storage", "--dir", str(self.dir / "storage"), "--node-id", "storage-0", *e])
            self._spawn("scheduler", ["shoal.nodes.scheduler_node", "--node-id", "scheduler-0", *e])
            for i in range(self.workers):
                args = ["shoal.nodes.worker.worker_node", "--model", self.model, "--dtype", self.dtype,
                        "--policy", self.policy, "--node-id", f"worker-{i}", *e]
                if self.worker_threads:
                    args += ["--threads", str(self.worker_threads)]
                self._spawn(f"worker-{i}", args)
            self.router = self._spawn("router", ["shoal.nodes.router", "--dir", str(self.dir / "router"),
                                                 "--node-id", "router-0", *e])
            from shoal.nodes.membership import MemberView

            view = MemberView(self.etcd.endpoint, self.cluster).start()
            want = {"storage-0", "scheduler-0", "router-0", *(f"worker-{i}" for i in range(self.workers))}
            if not view.wait_for(lambda m: want <= set(m), timeout):
                raise RuntimeError(f"nodes did not all register: {sorted(set(view.snapshot()))}")
            view.stop()
        except BaseException:
            self.stop()
            raise
        import json

        pids = [p.pid for p in self.procs] + [self.etcd.proc.pid]
        (self.dir / "cluster.json").write_text(json.dumps({"router": self.router, "etcd": self.etcd.endpoint,
                                                           "cluster": self.cluster, "pids": pids}))
        return self

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.terminate()
        deadline = time.monotonic() + 10
        for p in self.procs:
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        self.procs.clear()
        if self.etcd:
            self.etcd.stop()

    @staticmethod
    def stop_detached(state_dir: str | Path) -> int:
        """Stops a cluster that `shoal up --detach` left running; returns processes signalled."""
        import json

        path = Path(state_dir) / "cluster.json"
        if not path.exists():
            raise FileNotFoundError(f"no cluster recorded in {state_dir}")
        n = terminate_pids(json.loads(path.read_text())["pids"])
        path.unlink()
        return n

    def __enter__(self) -> "LocalCluster":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
