"""How a worker searches a vector index: find the shards in the cluster's membership,
send each shard the whole batch of queries in one call, fail over between replicas,
merge by score.

Storage nodes publish the shards they hold (`nodes/storage/index_service.py`). A shard's
replicas are tried in turn, each for `attempt_s`; one that fails is skipped for a
while. If no replica answers, the membership is read again (a shard may have been
loaded elsewhere) until `timeout_s` has passed, and then the search fails with an
error that names the shard and what each replica did. Runs on the retrieval thread
(and its shard threads): nothing here touches the compute thread.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from shoal.protocol.errors import ProtocolError, ShoalError
from shoal.transport.rpc import RemoteError, RpcClient
from shoal.topk import merge

SUSPECT_S = 10.0  # a replica that failed is tried last for this long


class IndexUnavailable(ShoalError, RuntimeError):
    """The index, or one of its shards, cannot be searched; the message says why."""


class SearchRefused(ShoalError, ValueError):
    """A replica refused the search itself (bad queries, or a bug): another replica
    would too, so it is not retried."""


# Errors that say "not here, try another replica"; any other is about the request.
FAILOVER_CODES = (ProtocolError.UNKNOWN_INDEX, ProtocolError.UNAVAILABLE, ProtocolError.STALE_EPOCH)


class IndexClient:
    def __init__(self, etcd: str, cluster: str, ctx, timeout_s: float = 30.0, attempt_s: float = 5.0):
        self.etcd, self.cluster, self.ctx = etcd, cluster, ctx
        self.timeout_s, self.attempt_s = timeout_s, min(attempt_s, timeout_s)
        self._calls = 0
        self.failovers = 0  # searches answered by a replica after another failed
        self._view = None
        self._local = threading.local()  # each shard thread has its own sockets
        self._suspect: dict[str, float] = {}  # node id -> until when it is tried last
        self._pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="shard-search")
        self._closing = threading.Event()  # set by close: searches under way give up at once

    def _members(self):
        if self._view is None:
            from shoal.nodes.membership import MemberView

            self._view = MemberView(self.etcd, self.cluster).start()
        return self._view.snapshot("storage")

    def locate(self, name: str) -> tuple[dict, list[list[tuple[str, str]]]]:
        """(the index as published, replicas[shard] = [(node id, address), ...]). If
        two builds are loaded under one name, the newest one with every shard
        somewhere is the index."""
        by_id: dict[str, dict] = {}
        for node_id, m in sorted(self._members().items()):
            pub = m.info.get("indexes", {}).get(name)
            if pub:
                entry = by_id.setdefault(pub["index_id"], {"info": pub, "replicas": [[] for _ in range(pub["shards_total"])]})
                for shard in pub["shards"]:
                    # Searches go to the node's search socket, apart from its write path.
                    entry["replicas"][shard].append((node_id, m.info.get("search_address") or m.info["address"]))
        complete = [e for e in by_id.values() if all(e["replicas"])]
        if not by_id:
            raise IndexUnavailable(f"no storage node holds index {name!r} (load it with `shoal index load` or "
                                   "Client.load_index)")
        if not complete:
            missing = {iid: [s for s, r in enumerate(e["replicas"]) if not r] for iid, e in by_id.items()}
            raise IndexUnavailable(f"index {name!r}: " + "; ".join(f"version {iid} lacks shards {m}"
                                                                    for iid, m in missing.items()))
        # A node that missed a reload may still hold an older build: the newest complete one is the index.
        newest = max(complete, key=lambda e: (e["info"].get("built_at", 0.0), e["info"]["index_id"]))
        return newest["info"], newest["replicas"]

    def _client(self, address: str) -> RpcClient:
        clients = self._local.__dict__.setdefault("clients", {})
        if address not in clients:
            clients[address] = RpcClient(address, self.ctx)
        return clients[address]

    def _search_shard(self, name: str, index_id: str, shard: int, replicas: list, queries: np.ndarray, k: int,
                      params: list[dict]) -> list:
        now = time.monotonic()
        # Reads rotate over the replicas (spreading load; every replica gets used, so a
        # dead one is found); one that failed lately goes last.
        self._calls += 1
        start = (self._calls + shard) % len(replicas)
        order = sorted(replicas[start:] + replicas[:start], key=lambda r: self._suspect.get(r[0], 0) > now)
        tried = []
        for node_id, address in order:
            if self._closing.is_set():
                raise IndexUnavailable(f"index {name!r} shard {shard}: the worker is stopping")
            try:
                reply = self._client(address).request(
                    "SearchIndex", {"name": name, "index_id": index_id, "shard": shard, "k": k, "count": len(queries),
                                    "params": params},
                    {"queries": np.ascontiguousarray(queries, np.float32).tobytes()}, timeout=self.attempt_s,
                    abandon=self._closing.is_set)
                self._suspect.pop(node_id, None)
                self.failovers += bool(tried)
                return reply["hits"]
            except (TimeoutError, RemoteError, OSError) as e:
                if self._closing.is_set():  # abandoned, not failed: the replica is not suspect
                    raise IndexUnavailable(f"index {name!r} shard {shard}: the worker is stopping") from None
                if isinstance(e, RemoteError) and e.code not in FAILOVER_CODES:
                    raise SearchRefused(f"index {name!r} shard {shard} on {node_id}: {e.message}") from None
                self._suspect[node_id] = time.monotonic() + SUSPECT_S
                if isinstance(e, TimeoutError):  # its socket may hold the lost request: start afresh
                    self._local.clients.pop(address).close()
                tried.append(f"{node_id}: {e}")
        raise IndexUnavailable(f"index {name!r} shard {shard}: no replica answered ({'; '.join(tried)})")

    def search(self, name: str, queries: np.ndarray, k: int, params: list[dict] | None = None) -> list[list[dict]]:
        """Top-k hits ({id, score, text}, best first) per query row, over every shard;
        `params`: per query, its approximate search setting ({} for the index's default)."""
        params = params if params and any(params) else []  # all defaults: sent as none
        deadline = time.monotonic() + self.timeout_s
        while True:
            try:
                info, replicas = self.locate(name)  # (k and dimension: checked per query by the caller)
                futures = [self._pool.submit(self._search_shard, name, info["index_id"], s, r, queries, k, params)
                           for s, r in enumerate(replicas)]
                per_shard = [f.result() for f in futures]
                return [merge([hits[q] for hits in per_shard], k) for q in range(len(queries))]
            except IndexUnavailable as e:
                if self._closing.is_set():
                    raise
                if time.monotonic() >= deadline:
                    raise IndexUnavailable(f"{e} within {self.timeout_s:.0f}s") from None
                time.sleep(min(0.5, max(0.0, deadline - time.monotonic())))

    def describe(self, name: str) -> dict:
        """The index as published (index_id, encoder, dim, rows, shards_total), waiting
        up to the timeout for it to appear."""
        deadline = time.monotonic() + self.timeout_s
        while True:
            try:
                return self.locate(name)[0]
            except IndexUnavailable:
                if time.monotonic() >= deadline:
                    raise
                time.sleep(0.2)

    def close(self) -> None:
        """Ends the searches under way (each gives up within a poll slice) and waits for
        the shard threads: their sockets are closed with the node's context next, which
        must not happen under a thread's poll."""
        self._closing.set()
        self._pool.shutdown(wait=True, cancel_futures=True)
        if self._view is not None:
            self._view.stop()
