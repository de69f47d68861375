"""What a benchmark reads from a local cluster: its worker's StatsQuery answer, and the
CPU seconds of its processes."""

from __future__ import annotations


def worker_stats(cluster, name: str = "worker-0") -> dict:
    from shoal.transport.rpc import RpcClient

    rpc = RpcClient(cluster.nodes[name][2])
    try:
        return rpc.request("StatsQuery", {}, timeout=10)["stats"]
    finally:
        rpc.close()


def node_cpu_seconds(cluster) -> dict[str, float]:
    """CPU seconds (user + system) each role's processes and etcd have used so far: on a
    machine whose cores the engine's threads fill, every other process's CPU time
    delays a step, and a parallel region waits for its slowest thread."""
    import psutil

    out: dict[str, float] = {}
    for name, proc in [*((n, v[0]) for n, v in cluster.nodes.items()), ("etcd", cluster.etcd.proc)]:
        role = name.split("-")[0]
        try:
            t = psutil.Process(proc.pid).cpu_times()
            out[role] = out.get(role, 0.0) + t.user + t.system
        except psutil.Error:  # exited meanwhile
            pass
    return out
