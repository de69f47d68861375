"""Where the shards of a vector index go: each on `replicas` distinct storage nodes.

Pure. A node that already holds a shard of the same index keeps it (loading again is
a no-op); the rest go to the least-loaded nodes (shards held of any index), ties to
the smallest node id, so the same cluster state always gives the same placement.
"""

from __future__ import annotations

from shoal.protocol.errors import ShoalError


class PlacementError(ShoalError, ValueError):
    """The shards cannot be placed as asked; the message says why."""


def place_shards(shards: int, nodes: list[str], replicas: int, load: dict[str, int] | None = None,
                 held: dict[int, set[str]] | None = None) -> list[list[str]]:
    """placement[shard] = the nodes (sorted) that hold that shard."""
    if replicas < 1:
        raise PlacementError(f"replicas must be at least 1, got {replicas}")
    if replicas > len(nodes):
        raise PlacementError(f"{replicas} replicas need {replicas} storage nodes; the cluster has {len(nodes)}"
                             + (f" ({', '.join(sorted(nodes))})" if nodes else ""))
    load = {n: (load or {}).get(n, 0) for n in nodes}
    placement = []
    for shard in range(shards):
        keep = sorted(n for n in (held or {}).get(shard, ()) if n in load)[:replicas]
        rest = sorted((n for n in nodes if n not in keep), key=lambda n: (load[n], n))
        chosen = keep + rest[:replicas - len(keep)]
        for n in chosen[len(keep):]:
            load[n] += 1
        placement.append(sorted(chosen))
    return placement
