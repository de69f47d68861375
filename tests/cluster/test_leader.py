"""Leader election in a real etcd: one leader at a time, epochs that only grow, a
standby that takes over when the leader's lease goes, and a watching view of who leads
that follows all of it."""

from __future__ import annotations

import threading
import time

from shoal.nodes.leader import Election, LeaderView


def test_one_leader_and_takeover_with_a_larger_epoch(etcd_endpoint, cluster_name):
    a = Election(etcd_endpoint, cluster_name, "sched-a", ttl=2)
    b = Election(etcd_endpoint, cluster_name, "sched-b", ttl=2)
    assert a.campaign()
    assert not b.campaign()
    assert a.is_leader() and not b.is_leader()
    assert a.current() == ("sched-a", a.epoch)
    won = threading.Event()
    t = threading.Thread(target=lambda: b.wait_for_leadership(timeout=20) and won.set())
    t.start()
    a.resign()
    t.join(25)
    assert won.is_set() and b.is_leader()
    assert b.epoch > a.epoch
    assert b.current() == ("sched-b", b.epoch)
    b.resign()


def test_frozen_leader_loses_leadership_on_its_own_clock(etcd_endpoint, cluster_name):
    a = Election(etcd_endpoint, cluster_name, "sched-a", ttl=2)
    assert a.campaign()
    a._stop.set()  # frozen: its lease is no longer refreshed
    a._thread.join()
    b = Election(etcd_endpoint, cluster_name, "sched-b", ttl=2)
    assert b.wait_for_leadership(timeout=15)
    assert not a.is_leader()  # its own deadline passed before b could win
    assert b.epoch > a.epoch
    b.resign()


def _becomes(view: LeaderView, want: tuple, timeout: float = 10.0) -> bool:
    end = time.monotonic() + timeout
    while view.current() != want and time.monotonic() < end:
        time.sleep(0.02)
    return view.current() == want


def test_leader_view_follows_elections_without_reading_etcd_per_question(etcd_endpoint, cluster_name):
    view = LeaderView(etcd_endpoint, cluster_name).start()
    try:
        assert view.current() == (None, 0)
        a = Election(etcd_endpoint, cluster_name, "sched-a", ttl=2)
        assert a.campaign()
        assert _becomes(view, ("sched-a", a.epoch)), view.current()
        a.resign()
        assert _becomes(view, (None, 0)), view.current()
        b = Election(etcd_endpoint, cluster_name, "sched-b", ttl=2)
        assert b.campaign()
        assert _becomes(view, ("sched-b", b.epoch)) and b.epoch > a.epoch
        # A view started now reads the leader that is already there.
        late = LeaderView(etcd_endpoint, cluster_name).start()
        assert late.current() == ("sched-b", b.epoch)
        late.stop()
        # Asking is answered from the watch: etcd sees no reads for it.
        calls = []
        view.client.get_response = lambda *a, **k: calls.append(a)
        for _ in range(100):
            assert view.current() == ("sched-b", b.epoch)
        assert calls == []
        b.resign()
    finally:
        view.stop()
