"""`shoal cluster-up` / `cluster-down`: start or stop this host's nodes from a cluster file."""

from __future__ import annotations

import json

from shoal.cluster_file import ClusterFile
from shoal.node_process import spawn_node, terminate_pids


def cluster_up(cf: ClusterFile, host_name: str) -> dict:
    host = cf.host(host_name)
    home = cf.state_dir / host.name
    pidfile = home / "pids.json"
    if pidfile.exists():
        raise RuntimeError(f"{host.name} already runs nodes ({pidfile}); cluster-down first")
    common = ["--etcd", cf.etcd[0], "--cluster", cf.cluster, "--bind", f"tcp://{host.address}:0"]
    started: dict = {"pids": [], "addresses": {}}
    env = None
    if cf.curve_keys:
        from shoal.nodes.curve import CurveKeys

        CurveKeys.load(cf.curve_keys)  # a missing keypair fails here, not in every node
        env = {"SHOAL_CURVE_KEYS": str(cf.curve_keys)}
    order = [r for r in ("storage", "scheduler", "worker", "router") if r in host.roles]
    try:
        for role in order:
            count = host.workers if role == "worker" else 1
            for i in range(count):
                name = f"{role}-{host.name}-{i}"
                args = [*common, "--node-id", name]
                if role in ("storage", "router"):
                    args += ["--dir", str(home / role)]
                if role == "worker":
                    args += ["--model", cf.model, "--dtype", cf.dtype]
                proc, address = spawn_node(role, name, args, home / "logs", env)
                started["pids"].append(proc.pid)
                started["addresses"][name] = address
                if role == "router":
                    (home / "router.txt").write_text(address + "\n")
    except BaseException:
        terminate_pids(started["pids"])
        raise
    pidfile.write_text(json.dumps(started))
    return started


def cluster_down(cf: ClusterFile, host_name: str) -> int:
    pidfile = cf.state_dir / cf.host(host_name).name / "pids.json"
    if not pidfile.exists():
        return 0
    n = terminate_pids(json.loads(pidfile.read_text())["pids"])
    pidfile.unlink()
    return n
