"""What a benchmark reads from a local cluster's worker: its StatsQuery answer."""

from __future__ import annotations


def worker_stats(cluster, name: str = "worker-0") -> dict:
    from shoal.transport.rpc import RpcClient

    rpc = RpcClient(cluster.nodes[name][2])
    try:
        return rpc.request("StatsQuery", {}, timeout=10)["stats"]
    finally:
        rpc.close()
