"""Membership in etcd: the one module that talks to etcd (through the `etcd3` API of
python3-etcd3).

A node registers `/shoal/<cluster>/members/<role>/<node_id>` under a lease that a
keep-alive thread refreshes. The node keeps its own lease deadline (last successful
refresh + TTL): in a partition etcd may already have expired the lease while the
client still looks alive, so `alive()` trusts only that deadline. Watchers list the
prefix, then watch from the next revision, and list again when the watch reports that
etcd compacted the revisions it needed.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import orjson

from shoal.extras import need

etcd3 = need("etcd3", "node", "a cluster node (membership in etcd)")
import etcd3.watch  # noqa: E402 - after the check that names the extra

log = logging.getLogger(__name__)

# python3-etcd3 0.13.0 calls `six.itervalues` when a watch stream fails but no longer
# imports six, so the failure never reaches the callbacks (and a watcher would silently
# stop). Give it what it expects.
if not hasattr(etcd3.watch, "six"):
    import types

    etcd3.watch.six = types.SimpleNamespace(itervalues=lambda d: iter(list(d.values())))


def members_prefix(cluster: str, role: str | None = None) -> str:
    return f"/shoal/{cluster}/members/" + (f"{role}/" if role else "")


ETCD_RETRY_S = 1.0
JOIN_TIMEOUT_S = 30.0  # how long a starting node keeps trying to reach etcd
# gRPC waits longer between reconnects the longer a server is away (up to 120 s by
# default): after a 30 s etcd outage a node would wait some 10 s more to see it back.
# Reconnect at least every second: one cheap TCP connect per node while etcd is down.
GRPC_OPTIONS = [("grpc.initial_reconnect_backoff_ms", 250), ("grpc.min_reconnect_backoff_ms", 250),
                ("grpc.max_reconnect_backoff_ms", 1000)]  # pairs: what grpc takes (not the dict etcd3 documents)


def connect(endpoint: str, timeout: float = 5.0):
    host, _, port = endpoint.rpartition(":")
    client = etcd3.client(host or "127.0.0.1", int(port), timeout=timeout, grpc_options=GRPC_OPTIONS)
    # After one failed call the client refuses its endpoint for time_retry seconds
    # (300 by default): a cluster would stay deaf for five minutes after etcd returns.
    for ep in client.endpoints.values():
        ep.time_retry = ETCD_RETRY_S
    return client


def refresh_deadline(lease) -> float | None:
    """Refreshes a lease; returns the new deadline on this node's own clock (measured
    from before the request, so it never overstates), or None if etcd says the lease
    has expired. Shared by membership and leadership."""
    t = time.monotonic()
    resp = lease.refresh()
    return t + resp[0].TTL if resp and resp[0].TTL > 0 else None


@dataclass(frozen=True)
class Member:
    role: str
    node_id: str
    info: dict


def _member(key: bytes, value: bytes) -> Member:
    parts = key.decode().split("/")
    return Member(parts[-2], parts[-1], orjson.loads(value))


def list_members(endpoint: str, cluster: str, timeout: float = 5.0) -> list[Member]:
    """The members registered now (one read, no watch): for tools like `shoal nodes`."""
    client = connect(endpoint, timeout=timeout)
    try:
        return [_member(kv.key, kv.value) for kv in client.get_prefix_response(members_prefix(cluster)).kvs]
    finally:
        client.close()


class Registration:
    """This node's membership record and the lease behind it."""

    def __init__(self, endpoint: str, cluster: str, role: str, node_id: str, info: dict, ttl: int = 3,
                 client=None):
        """`client`: an etcd client to share (a process hosting many simulated nodes);
        by default this registration opens its own."""
        if ttl < 2:
            raise ValueError("etcd grants leases of at least 2 s")
        self.endpoint, self.cluster, self.role, self.node_id = endpoint, cluster, role, node_id
        self.info = info
        self.ttl = ttl
        self.key = members_prefix(cluster, role) + node_id
        self.client = client or connect(endpoint)
        self.lease = None
        self.deadline = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.on_lost: Callable[[], None] | None = None
        # Called before registering again after the lease expired: the node lets go of
        # what it held, because the cluster has already given it to others.
        self.on_rejoin: Callable[[], None] | None = None
        self.incarnation = 0

    def start(self, join_timeout: float = JOIN_TIMEOUT_S) -> "Registration":
        """Registers, trying again for up to `join_timeout` seconds while etcd cannot be
        reached (a host that boots before etcd, a lost SYN on a lossy link: a node
        started by `cluster-up` should not die of its first connect)."""
        # (no sooner than the client's own retry time: until then it refuses the endpoint)
        deadline, wait = time.monotonic() + join_timeout, ETCD_RETRY_S + 0.05
        while True:
            try:
                self._grant()
                break
            except (etcd3.exceptions.ConnectionFailedError, etcd3.exceptions.ConnectionTimeoutError,
                    etcd3.exceptions.NoServerAvailableError) as e:
                if time.monotonic() + wait > deadline:
                    raise RuntimeError(f"etcd at {self.endpoint} unreachable for {join_timeout:.0f} s: "
                                       f"{type(e).__name__}: {e}") from e
                log.warning("[join] %s: etcd at %s unreachable (%s); trying again in %.2f s", self.node_id,
                            self.endpoint, type(e).__name__, wait)
                time.sleep(wait)
                wait = min(2 * wait, 2.0)
        self._thread = threading.Thread(target=self._keep_alive, name=f"lease-{self.node_id}", daemon=True)
        self._thread.start()
        log.info("[join] %s %s registered at %s", self.role, self.node_id, self.key)
        return self

    def _grant(self) -> None:
        """A lease and the record under it. The record names the lease: a node that
        comes back after losing its lease is a new incarnation, so a scheduler that
        never saw it vanish still knows its earlier work is gone."""
        t = time.monotonic()
        self.lease = self.client.lease(self.ttl)
        self.incarnation = self.lease.id
        self.client.put(self.key, orjson.dumps({**self.info, "incarnation": self.incarnation}), lease=self.lease)
        self.deadline = t + self.ttl

    def alive(self) -> bool:
        return time.monotonic() < self.deadline

    def publish(self, **fields) -> None:
        """Adds to (or changes) what this node published, under the same lease: e.g.
        the index shards a storage node has loaded."""
        self.info = {**self.info, **fields}
        if self.lease is not None:
            self.client.put(self.key, orjson.dumps({**self.info, "incarnation": self.incarnation}), lease=self.lease)

    def _keep_alive(self) -> None:
        while not self._stop.wait(self.ttl / 3):
            try:
                deadline = refresh_deadline(self.lease)
                if deadline is not None:
                    self.deadline = deadline
                    continue
                log.warning("[lease] %s: lease expired in etcd; registering again", self.node_id)
                self.deadline = 0.0
                if self.on_rejoin:
                    self.on_rejoin()
                self._grant()
            except Exception as e:  # etcd away: keep trying; our deadline decides liveness
                if not self.alive():
                    log.warning("[lease] %s: past own lease deadline (%s)", self.node_id, e)
                    if self.on_lost:
                        self.on_lost()

    def stop(self, revoke: bool = True) -> None:
        """Leave: with `revoke`, the record vanishes now instead of at lease expiry."""
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=self.ttl)
        if revoke and self.lease is not None:
            try:
                self.lease.revoke()
            except Exception as e:
                log.warning("[leave] %s: could not revoke lease: %s", self.node_id, e)
        self.deadline = 0.0
        log.info("[leave] %s %s", self.role, self.node_id)


def retry_after_pause(attempt: Callable[[], None], stopped: Callable[[], bool], what: str) -> None:
    """A watch broke (etcd restarted or is away): `attempt` (list or read again, and watch
    anew) until etcd answers or the watcher stops, at least once a second (etcd's return
    is seen within about a second; a try against an etcd that is away costs next to nothing)."""
    pause = 0.25
    while not stopped():
        time.sleep(pause)
        try:
            attempt()
            return
        except Exception as e:
            log.warning("[watch] %s failed (%s); retrying in %.1f s", what, e, pause)
            pause = min(pause * 2, ETCD_RETRY_S)


def cancel_watch_quietly(client, watch_id) -> None:
    """Ends a watch if there is one; a client already cut off from etcd has none to end."""
    if watch_id is not None:
        try:
            client.cancel_watch(watch_id)
        except Exception:
            pass


class MemberView:
    """The live set of members under a cluster's prefix, kept current by a watch."""

    def __init__(self, endpoint: str, cluster: str, on_change: Callable[[dict], None] | None = None):
        self.client = connect(endpoint)
        self.prefix = members_prefix(cluster)
        self.on_change = on_change
        self.listeners: list[Callable[[dict], None]] = []  # more on_change callbacks (e.g. an AddressBook)
        self.members: dict[str, Member] = {}
        self.lock = threading.Lock()
        self.changed = threading.Condition(self.lock)
        self._watch_id = None
        self.relists = 0
        self.version = 0  # counts changes: a reader can tell its copy is still current
        self._stopped = False

    def start(self) -> "MemberView":
        self._relist()
        return self

    def _relist(self) -> None:
        resp = self.client.get_prefix_response(self.prefix)
        members = {kv.key.decode(): _member(kv.key, kv.value) for kv in resp.kvs}
        with self.lock:
            self.members = members
            self.version += 1
            self.changed.notify_all()
        self.relists += 1
        if self._watch_id is not None:
            self.client.cancel_watch(self._watch_id)
        self._watch_id = self.client.add_watch_prefix_callback(
            self.prefix, self._on_watch, start_revision=resp.header.revision + 1)
        self._notify()

    def _on_watch(self, event) -> None:
        if isinstance(event, etcd3.exceptions.RevisionCompactedError):
            log.info("[watch] revisions compacted at %s; listing again", event.compacted_revision)
            threading.Thread(target=self._relist, daemon=True).start()
            return
        if isinstance(event, Exception):
            log.warning("[watch] %s; listing again", event)
            threading.Thread(target=self._relist_after_pause, daemon=True).start()
            return
        with self.lock:
            for ev in event.events:
                key = ev.key.decode()
                if isinstance(ev, etcd3.events.DeleteEvent):
                    self.members.pop(key, None)
                else:
                    self.members[key] = _member(ev.key, ev.value)
            self.version += 1
            self.changed.notify_all()
        self._notify()

    def _relist_after_pause(self) -> None:
        """The watch broke: until then the view keeps its last known members."""
        retry_after_pause(self._relist, lambda: self._stopped, "relist")

    def _notify(self) -> None:
        snapshot = self.snapshot()
        for listener in ([self.on_change] if self.on_change else []) + self.listeners:
            listener(snapshot)

    def snapshot(self, role: str | None = None) -> dict[str, Member]:
        with self.lock:
            return {m.node_id: m for m in self.members.values() if role is None or m.role == role}

    def member(self, role: str, node_id: str) -> Member | None:
        """One member, looked up without copying the view (for lookups on a hot path)."""
        with self.lock:
            return self.members.get(f"{self.prefix}{role}/{node_id}")

    def storage_address(self) -> str | None:
        """The storage node a job's inputs, results and log go to: the one with the
        smallest id, so that the router and every scheduler make the same choice."""
        members = self.snapshot("storage")
        return members[min(members)].info["address"] if members else None

    def wait_for(self, predicate: Callable[[dict], bool], timeout: float) -> bool:
        """Waits (on watch events, not sleeps) until predicate(snapshot) holds."""
        deadline = time.monotonic() + timeout
        with self.lock:
            while not predicate({m.node_id: m for m in self.members.values()}):
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self.changed.wait(left)
            return True

    def stop(self) -> None:
        self._stopped = True
        cancel_watch_quietly(self.client, self._watch_id)
