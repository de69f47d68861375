"""`shoal cluster-up` / `cluster-down`: start or stop this host's nodes from a cluster file."""

from __future__ import annotations

import json
from pathlib import Path

from shoal.cluster.cluster_file import ClusterFile
from shoal.cluster.gpu_assignment import host_gpus, wants_gpu, worker_gpu_env
from shoal.nodes.worker.kv_cache_size import DEFAULT_SHARE
from shoal.cluster.node_process import spawn_node, terminate_pids


def cluster_up(cf: ClusterFile, host_name: str) -> dict:
    host = cf.host(host_name)
    home = cf.state_dir / host.name
    pidfile = home / "pids.json"
    if pidfile.exists():
        raise RuntimeError(f"{host.name} already runs nodes ({pidfile}); cluster-down first")
    common = ["--etcd", cf.etcd[0], "--cluster", cf.cluster, "--bind", f"tcp://{host.address}:0"]
    if cf.insecure:
        common.append("--insecure")
    started: dict = {"pids": [], "addresses": {}, "keys": None}
    env = None
    keys = cluster_keys(cf, host)
    if keys is not None:
        env = {"SHOAL_CURVE_KEYS": str(keys)}
        started["keys"] = str(keys)
    order = [r for r in ("storage", "scheduler", "worker", "router") if r in host.roles]
    envs = worker_envs(host, cf.device, host_gpus) if "worker" in host.roles else []
    try:
        for role in order:
            count = len(envs) if role == "worker" else 1
            for i in range(count):
                name = f"{role}-{host.name}-{i}"
                args = [*common, "--node-id", name]
                if role in ("storage", "router"):
                    args += ["--dir", str(home / role)]
                if role in ("storage", "router"):  # the router reads an index's manifest to place its shards
                    args += [f"--data-root={r}" for r in cf.data_roots]
                if role == "worker":
                    # the host's workers share the memory the KV caches default to
                    args += ["--model", cf.model, "--dtype", cf.dtype, "--device", cf.device,
                             f"--kv-cache-share={DEFAULT_SHARE / count:.4g}"]
                    args += [f"--allow-programs={p}" for p in cf.allow_programs]
                    if cf.encoder:
                        args += ["--encoder", cf.encoder]
                node_env = {**(env or {}), **envs[i]} if role == "worker" and envs[i] else env
                proc, address = spawn_node(role, name, args, home / "logs", node_env,
                                           beside_workers="worker" in host.roles)
                started["pids"].append(proc.pid)
                started["addresses"][name] = address
                if role == "router":
                    (home / "router.txt").write_text(address + "\n")
    except BaseException:
        terminate_pids(started["pids"])
        raise
    pidfile.write_text(json.dumps(started))
    return started


def worker_envs(host, device: str, detect=host_gpus) -> list[dict]:
    """One environment per worker of `host`: each sees one GPU of the host's (its `gpus`,
    else every GPU `detect` finds), round robin; as many workers as the host sets, else
    one per GPU, else one on the CPU."""
    gpus = (list(host.gpus) if host.gpus is not None else detect()) if wants_gpu(device) else []
    count = host.workers if host.workers is not None else max(1, len(gpus))
    return [worker_gpu_env(i, gpus, count) for i in range(count)]


def cluster_keys(cf: ClusterFile, host) -> Path | None:
    """The CURVE key folder this host's nodes use: the file's `curve_keys` (which must
    exist), or, for a host listening beyond loopback, <state_dir>/keys (none on loopback
    or with `insecure`). Missing, those are made by one host only, the first that runs
    a scheduler; every other host must be given a copy (the same keys everywhere:
    two keypairs would split the cluster)."""
    from shoal.transport.curve import CurveKeys, generate
    from shoal.nodes.exposure import is_loopback

    if cf.curve_keys is not None:
        CurveKeys.load(cf.curve_keys)  # a missing keypair fails here, not in every node
        return Path(cf.curve_keys)
    if cf.insecure or is_loopback(f"tcp://{host.address}:0"):
        return None
    keys = cf.state_dir / "keys"
    if not (keys / "cluster.key_secret").exists():
        maker = next(h for h in cf.hosts if "scheduler" in h.roles)
        if host.name != maker.name:
            raise RuntimeError(f"no CURVE keys at {keys}: copy that folder from host {maker.name!r} (its cluster-up "
                               "makes them), or set insecure = true in the cluster file")
        generate(keys)
        print(f"made CURVE keys in {keys}: copy that folder to every other host (same path) and give it to "
              f"clients (SHOAL_CURVE_KEYS={keys})", flush=True)
    CurveKeys.load(keys)
    return keys


def cluster_down(cf: ClusterFile, host_name: str) -> int:
    pidfile = cf.state_dir / cf.host(host_name).name / "pids.json"
    if not pidfile.exists():
        return 0
    n = terminate_pids(json.loads(pidfile.read_text())["pids"])
    pidfile.unlink()
    return n
