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

from shoal.cluster.etcd_server import EtcdServer
from shoal.nodes.worker.kv_cache_size import DEFAULT_SHARE
from shoal.cluster.node_process import spawn_node, terminate_pids


class LocalCluster:
    def __init__(self, model: str | Path | None = None, workers: int = 1, state_dir: str | Path | None = None,
                 cluster: str = "local", dtype: str = "auto", policy: str = "ebplus", worker_threads: int | None = None,
                 schedulers: int = 1, env: dict | None = None, worker_args: list[str] | None = None,
                 curve_keys: str | Path | None = None, host: str = "127.0.0.1",
                 scheduler_args: list[str] | None = None, encoder: str | Path | None = None, storage_nodes: int = 1,
                 storage_args: list[str] | None = None, die_with_parent: bool = True, insecure: bool = False,
                 http_port: int = 0, device: str = "auto", gpus: list[str] | None = None):
        """`schedulers` > 1 starts standbys; `env` is added to every node's environment
        (e.g. a fault plan, `SHOAL_FAULTS`); `worker_args` go to every worker;
        `curve_keys` (a `shoal keys generate` directory) encrypts every connection;
        etcd and every node listen on `host`; `scheduler_args` go to every scheduler
        (e.g. `--no-steal`). Workers host the decoder `model`, the `encoder`, or both.
        `storage_nodes` > 1 starts more storage nodes (index shards spread over them;
        jobs keep their results on storage-0, the smallest id); `storage_args` go to every
        storage node (e.g. `--max-item-bytes`). Unless `die_with_parent` is False (a
        detached `shoal up`), etcd and every node end when this process ends, however
        it ends. On a `host` beyond loopback every connection needs CURVE keys: without
        `curve_keys` they are made in STATE_DIR/keys (clients: SHOAL_CURVE_KEYS), unless
        `insecure`; there workers run only built-in programs and storage opens no path a
        request names unless `worker_args` / `storage_args` allow them (`exposure.py`).
        `http_port`: the router serves its status page there (0: none). `device` is every
        worker's (`--device`); with `auto` or `cuda` each worker sees one of `gpus`
        (default: the host's, `gpu_assignment.py`), round robin: one worker per GPU, or, with
        more workers than GPUs, those sharing one split its memory."""
        if model is None and encoder is None:
            raise ValueError("a local cluster's workers need a model (decoder), an encoder, or both")
        self.encoder = str(encoder) if encoder else None
        self.model, self.workers, self.cluster, self.dtype, self.policy = model and str(model), workers, cluster, dtype, policy
        self.worker_threads, self.schedulers, self.env = worker_threads, schedulers, env
        self.worker_args = worker_args or []
        self.scheduler_args = scheduler_args or []
        self.host = host
        self.storage_nodes = storage_nodes
        self.storage_args = storage_args or []
        self.die_with_parent = die_with_parent
        self.http_port = http_port
        from shoal.cluster.gpu_assignment import host_gpus, wants_gpu
        from shoal.nodes.worker.device_choice import check_device_name

        self.device = check_device_name(device)
        self.gpus = (host_gpus() if gpus is None else list(gpus)) if wants_gpu(device) else []
        self.started_workers = 0
        self.prefixes: dict[str, list[str] | None] = {}
        self.node_env: dict[str, dict | None] = {}
        self.dir = Path(state_dir or tempfile.mkdtemp(prefix="shoal-"))
        self.insecure = insecure
        from shoal.nodes.exposure import is_loopback

        if not curve_keys and not insecure and not is_loopback(f"tcp://{host}:0"):
            from shoal.transport.curve import generate

            curve_keys = self.dir / "keys"
            if not (curve_keys / "cluster.key_secret").exists():
                generate(curve_keys)
        self.curve_keys = str(curve_keys) if curve_keys else None
        if curve_keys:
            self.env = {**(self.env or {}), "SHOAL_CURVE_KEYS": str(curve_keys)}
        self.procs: list[subprocess.Popen] = []
        self.nodes: dict[str, tuple[subprocess.Popen, list[str], str]] = {}  # name -> (process, args, address)
        self.etcd: EtcdServer | None = None
        self.router = ""
        self._node_timeout: float | None = None  # while starting: each node's time to start

    def _spawn(self, name: str, args: list[str], env: dict | None = None, prefix: list[str] | None = None) -> str:
        if not any(a.startswith("--bind") for a in args):
            args = [*args, f"--bind=tcp://{self.host}:0"]
        if self.insecure:
            args = [*args, "--insecure"]
        proc, address = spawn_node(name.split("-")[0], name, args[1:], self.dir / "logs",
                                   self.env if env is None else env, prefix, self.die_with_parent, beside_workers=True,
                                   timeout=self._node_timeout)
        self.procs.append(proc)
        self.nodes[name] = (proc, args, address)
        self.node_env[name] = env  # a restart keeps it (a worker keeps its GPU)
        self.prefixes[name] = prefix
        return address

    def _worker_args(self, name: str) -> list[str]:
        args = ["shoal.nodes.worker.worker_node", "--dtype", self.dtype, "--device", self.device,
                "--policy", self.policy, "--node-id", name, "--etcd", self.etcd.endpoint,
                "--cluster", self.cluster, f"--kv-cache-share={DEFAULT_SHARE / max(1, self.workers):.4g}", *self.worker_args]
        if self.model:
            args[1:1] = ["--model", self.model]
        if self.encoder:
            args += ["--encoder", self.encoder]
        if self.worker_threads:
            args += ["--threads", str(self.worker_threads)]
        return args

    def _worker_env(self) -> dict | None:
        """The next worker's environment: the cluster's, and its own GPU where it has one."""
        from shoal.cluster.gpu_assignment import worker_gpu_env

        gpu = worker_gpu_env(self.started_workers, self.gpus, self.workers)
        self.started_workers += 1
        return {**(self.env or {}), **gpu} if gpu else self.env

    def add_worker(self, name: str, host: str | None = None, prefix: list[str] | None = None,
                   timeout: float = 120, extra_args: list[str] | None = None) -> str:
        """Starts one more worker on the running cluster and waits until it registers;
        `host` is the address it listens on, `prefix` wraps its command (`ip netns exec
        NS` puts it on a network host of its own), `extra_args` come after the cluster's
        worker arguments (and so override them). Returns its address. Its KV cache takes
        the share of one of the cluster's first `workers` (pass `--kv-cache-share` or
        `--kv-cache-bytes` in `extra_args` to size it otherwise)."""
        from shoal.nodes.membership import MemberView

        address = self._spawn(name, [*self._worker_args(name), f"--bind=tcp://{host or self.host}:0",
                                     *(extra_args or [])], env=self._worker_env(), prefix=prefix)
        view = MemberView(self.etcd.endpoint, self.cluster).start()
        try:
            if not view.wait_for(lambda m: name in m, timeout):
                raise RuntimeError(f"{name} did not register within {timeout}s")
        finally:
            view.stop()
        return address

    def process(self, name: str) -> subprocess.Popen:
        return self.nodes[name][0]

    def restart(self, name: str, env: dict | None = None, new_address: bool = False) -> str:
        """Starts a node again as it was started (same id, same directory, same address,
        so its peers' sockets reconnect) after it died; `env` replaces the cluster's.
        With `new_address` it binds a free port instead, as a node moved to another
        port or host would: its peers find it by id in membership."""
        proc, args, address = self.nodes[name]
        if proc.poll() is None:
            raise RuntimeError(f"{name} is still running")
        proc.wait()
        self.procs.remove(proc)
        bind = f"tcp://{address.rsplit(':', 2)[-2].lstrip('/')}:0" if new_address else address
        new = self._spawn(name, [a for a in args if not a.startswith("--bind=")] + [f"--bind={bind}"],
                          self.node_env.get(name) if env is None else env, self.prefixes[name])
        self.nodes[name] = (self.nodes[name][0], args, new)
        return new

    def start(self, timeout: float = 600, node_timeout: float | None = None) -> "LocalCluster":
        """Starts etcd and every node, then waits up to `timeout` seconds for all of them
        to register. `node_timeout`: how long each node may take to start (a worker loads
        and calibrates its models first), after which it is killed and the start fails
        naming its log; None: as long as it takes (a first start may calibrate for minutes)."""
        self._node_timeout = node_timeout
        try:
            self.etcd = EtcdServer(self.dir / "etcd", host=self.host, die_with_parent=self.die_with_parent).start()
            e = ["--etcd", self.etcd.endpoint, "--cluster", self.cluster]
            for i in range(self.storage_nodes):
                folder = self.dir / ("storage" if i == 0 else f"storage-{i}")
                self._spawn(f"storage-{i}", ["shoal.nodes.storage.storage_node", "--dir", str(folder), "--node-id", f"storage-{i}", *e,
                                                    *self.storage_args])
            for i in range(self.schedulers):
                self._spawn(f"scheduler-{i}", ["shoal.nodes.scheduler_node", "--node-id", f"scheduler-{i}", *e,
                                               *self.scheduler_args])
            for i in range(self.workers):
                self._spawn(f"worker-{i}", self._worker_args(f"worker-{i}"), env=self._worker_env())
            page = ["--http-port", str(self.http_port), "--http-host", self.host] if self.http_port else []
            self.router = self._spawn("router-0", ["shoal.nodes.router", "--dir", str(self.dir / "router"),
                                                   "--node-id", "router-0", *e, *page])
            from shoal.nodes.membership import MemberView

            view = MemberView(self.etcd.endpoint, self.cluster).start()
            want = {*(f"storage-{i}" for i in range(self.storage_nodes)), "router-0", *(f"scheduler-{i}" for i in range(self.schedulers)),
                    *(f"worker-{i}" for i in range(self.workers))}
            if not view.wait_for(lambda m: want <= set(m), timeout):
                raise RuntimeError(f"nodes did not all register: {sorted(set(view.snapshot()))}")
            view.stop()
        except BaseException:
            self.stop()
            raise
        finally:
            self._node_timeout = None  # a node restarted later waits as long as it takes
        import json

        pids = [p.pid for p in self.procs] + [self.etcd.proc.pid]
        (self.dir / "cluster.json").write_text(json.dumps({"router": self.router, "etcd": self.etcd.endpoint,
                                                           "cluster": self.cluster, "pids": pids,
                                                           "curve_keys": self.curve_keys}))
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
