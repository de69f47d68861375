"""Leader election in a real etcd: one leader at a time, epochs that only grow, and a
standby that takes over when the leader's lease goes."""

from __future__ import annotations

import threading

from shoal.nodes.leader import Election


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
