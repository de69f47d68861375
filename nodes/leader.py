"""Leader election for the scheduler, in etcd.

A candidate creates `/shoal/<cluster>/leader` under its own lease in one transaction
that succeeds only if the key does not exist. The key's create revision is the
leader's epoch: it only grows, so every command a leader sends carries an epoch that
workers and storage can compare, and a frozen old leader's commands (smaller epoch)
are refused. The leader keeps its own lease deadline and stops acting as leader when it
passes, whatever etcd's client thinks. Nodes that only need to know who leads (the
router) watch the key (`LeaderView`) instead of reading it for every request.
"""

from __future__ import annotations

import logging
import threading
import time

import etcd3

from shoal.nodes.membership import cancel_watch_quietly, connect, refresh_deadline, retry_after_pause

log = logging.getLogger(__name__)


def leader_key(cluster: str) -> str:
    return f"/shoal/{cluster}/leader"


class Election:
    def __init__(self, endpoint: str, cluster: str, node_id: str, ttl: int = 3):
        self.client = connect(endpoint)
        self.key = leader_key(cluster)
        self.node_id = node_id
        self.ttl = ttl
        self.lease = None
        # A lease let go of while etcd was away: revoked before the next campaign, so
        # that this node's own old key does not hold the election up for its TTL.
        self._unrevoked = None
        self.epoch = 0
        self.deadline = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def campaign(self) -> bool:
        """One attempt; True if this node is now the leader."""
        if self._unrevoked is not None:
            try:
                self._unrevoked.revoke()
            except Exception as e:
                if "lease not found" not in str(e):
                    raise  # etcd still away (its client says so in several ways): kept for the next try
                # expired already: nothing to let go of
            self._unrevoked = None
        t = time.monotonic()
        lease = self.client.lease(self.ttl)
        ok, _ = self.client.transaction(
            compare=[self.client.transactions.create(self.key) == 0],
            success=[self.client.transactions.put(self.key, self.node_id, lease)],
            failure=[])
        if not ok:
            lease.revoke()
            return False
        _, meta = self.client.get(self.key)
        self.lease, self.epoch, self.deadline = lease, meta.create_revision, t + self.ttl
        self._thread = threading.Thread(target=self._keep_alive, name="leader-lease", daemon=True)
        self._thread.start()
        log.info("[leader] %s elected, epoch %d", self.node_id, self.epoch)
        return True

    def wait_for_leadership(self, timeout: float | None = None) -> bool:
        """Campaigns until elected (waking when the leader key is deleted)."""
        end = None if timeout is None else time.monotonic() + timeout
        while not self._stop.is_set():
            if self.campaign():
                return True
            gone = threading.Event()
            watch_id = self.client.add_watch_callback(
                self.key, lambda ev: gone.set() if isinstance(ev, Exception) or any(
                    isinstance(e, etcd3.events.DeleteEvent) for e in ev.events) else None)
            try:
                if self.client.get(self.key)[0] is None:
                    continue  # vanished before the watch started
                left = None if end is None else end - time.monotonic()
                if left is not None and left <= 0:
                    return False
                gone.wait(left if left is not None else None)
            finally:
                self.client.cancel_watch(watch_id)
        return False

    def is_leader(self) -> bool:
        return self.lease is not None and time.monotonic() < self.deadline

    def current(self) -> tuple[str | None, int]:
        """(leader node id, epoch) as etcd sees it now."""
        value, meta = self.client.get(self.key)
        return (value.decode(), meta.create_revision) if value is not None else (None, 0)

    def _keep_alive(self) -> None:
        lease = self.lease
        while not self._stop.wait(self.ttl / 3) and self.lease is lease:
            try:
                deadline = refresh_deadline(lease)
                if deadline is not None:
                    self.deadline = deadline
                else:
                    log.warning("[leader] %s lost its lease (epoch %d)", self.node_id, self.epoch)
                    self.deadline = 0.0
                    return
            except Exception as e:
                log.warning("[leader] lease refresh failed: %s", e)

    def step_down(self) -> None:
        """Lets go of a lost (or losing) leadership so that this node can campaign again."""
        lease, self.lease, self.deadline = self.lease, None, 0.0
        if lease is not None:
            try:
                lease.revoke()
            except Exception:  # expired already, or etcd unreachable: revoked before the next campaign
                self._unrevoked = lease

    def resign(self) -> None:
        self._stop.set()
        if self.lease is not None:
            try:
                self.lease.revoke()
            except Exception:
                pass
        self.lease, self.deadline = None, 0.0


class LeaderView:
    """Who leads, as (node id, epoch), kept current by a watch on the leader key: for
    a node that forwards requests to the leader (the router). Reading the key for each
    request is a linearizable read, a round of etcd's consensus: a client waiting on a
    job made ~7 a second, a third of etcd's wakeups on a 2-core machine where each one
    preempts a worker's compute thread. The watch's answer is no staler than a read's
    (leadership can change just after either): a stepped-down leader refuses what
    reaches it (NOT_LEADER) and the client retries."""

    def __init__(self, endpoint: str, cluster: str, client=None):
        """`client`: an etcd client to share (e.g. a MemberView's): its watches share one
        stream and its threads, each of which wakes ~10 times a second while it waits."""
        self.client = client or connect(endpoint)
        self.key = leader_key(cluster)
        self._leader: tuple[str | None, int] = (None, 0)
        self._watch_id = None
        self._stopped = False

    def start(self) -> "LeaderView":
        self._read()
        return self

    def current(self) -> tuple[str | None, int]:
        return self._leader

    def _read(self) -> None:
        resp = self.client.get_response(self.key)
        kv = resp.kvs[0] if resp.kvs else None
        self._leader = (kv.value.decode(), kv.create_revision) if kv is not None else (None, 0)
        if self._watch_id is not None:
            self.client.cancel_watch(self._watch_id)
        self._watch_id = self.client.add_watch_callback(self.key, self._on_watch,
                                                        start_revision=resp.header.revision + 1)

    def _on_watch(self, event) -> None:
        if isinstance(event, etcd3.exceptions.RevisionCompactedError):
            threading.Thread(target=self._read, daemon=True).start()
            return
        if isinstance(event, Exception):  # etcd away: read again once it answers (the last answer stands meanwhile)
            log.warning("[leader] watch of %s: %s; reading again", self.key, event)
            threading.Thread(target=retry_after_pause, args=(self._read, lambda: self._stopped, f"reading {self.key}"),
                             daemon=True).start()
            return
        for ev in event.events:
            deleted = isinstance(ev, etcd3.events.DeleteEvent)
            self._leader = (None, 0) if deleted else (ev.value.decode(), ev.create_revision)

    def stop(self) -> None:
        self._stopped = True
        cancel_watch_quietly(self.client, self._watch_id)
