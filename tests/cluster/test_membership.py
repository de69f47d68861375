"""Membership against a real etcd: join, leave, lease expiry of a killed process, own
deadline, and the re-list after a watch hits compacted revisions."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time


from shoal.nodes.membership import MemberView, Registration, connect, members_prefix


def test_join_and_leave_are_seen_by_a_watcher(etcd_endpoint, cluster_name):
    view = MemberView(etcd_endpoint, cluster_name).start()
    a = Registration(etcd_endpoint, cluster_name, "worker", "w1", {"address": "tcp://127.0.0.1:1"}).start()
    b = Registration(etcd_endpoint, cluster_name, "storage", "s1", {"address": "tcp://127.0.0.1:2"}).start()
    assert view.wait_for(lambda m: set(m) == {"w1", "s1"}, timeout=5)
    # The record names the lease it lives under: the node's incarnation.
    assert view.snapshot("worker")["w1"].info == {"address": "tcp://127.0.0.1:1", "incarnation": a.lease.id}
    assert a.alive() and b.alive()
    a.stop()
    assert view.wait_for(lambda m: set(m) == {"s1"}, timeout=5)
    assert not a.alive()
    b.stop()
    view.stop()


def test_killed_process_vanishes_when_its_lease_expires(etcd_endpoint, cluster_name):
    view = MemberView(etcd_endpoint, cluster_name).start()
    code = ("import sys, time; from shoal.nodes.membership import Registration; "
            f"Registration({etcd_endpoint!r}, {cluster_name!r}, 'worker', 'doomed', {{}}, ttl=2).start(); "
            "print('up', flush=True); time.sleep(120)")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "up"
        assert view.wait_for(lambda m: "doomed" in m, timeout=5)
        os.kill(proc.pid, signal.SIGKILL)
        t = time.monotonic()
        assert view.wait_for(lambda m: "doomed" not in m, timeout=10)
        assert time.monotonic() - t < 6  # within about one TTL, not forever
    finally:
        proc.kill()
        proc.wait()
        view.stop()


def test_own_deadline_passes_without_refresh(etcd_endpoint, cluster_name):
    reg = Registration(etcd_endpoint, cluster_name, "worker", "w2", {}, ttl=2).start()
    reg._stop.set()  # a wedged keep-alive: nothing refreshes the lease any more
    reg._thread.join()
    assert reg.alive()
    time.sleep(2.1)
    assert not reg.alive()  # the node stops taking work on its own clock


def test_watch_relists_after_compaction(etcd_endpoint, cluster_name):
    view = MemberView(etcd_endpoint, cluster_name).start()
    client = connect(etcd_endpoint)
    old_rev = client.get_prefix_response(members_prefix(cluster_name)).header.revision
    view.client.cancel_watch(view._watch_id)  # the watcher misses what follows
    view._watch_id = None
    reg = Registration(etcd_endpoint, cluster_name, "router", "r1", {}).start()
    for i in range(5):
        client.put(f"/shoal/{cluster_name}/scratch", str(i))
    client.compact(client.get_prefix_response("/").header.revision)
    view._watch_id = view.client.add_watch_prefix_callback(
        members_prefix(cluster_name), view._on_watch, start_revision=old_rev + 1)
    assert view.wait_for(lambda m: "r1" in m, timeout=5)
    assert view.relists == 2
    reg.stop()
    view.stop()


def test_a_node_started_before_etcd_joins_once_it_answers(tmp_path, cluster_name):
    """A starting node keeps trying to reach etcd (a host that boots first, a SYN lost on
    a lossy link) and registers once etcd answers; against an etcd that never comes, it
    fails after its join timeout, naming the endpoint."""
    import threading

    import pytest

    from shoal.cluster.etcd_server import EtcdServer

    etcd = EtcdServer(tmp_path / "etcd")  # its ports chosen, not started yet
    late = threading.Timer(1.5, etcd.start)
    late.start()
    t = time.monotonic()
    try:
        reg = Registration(etcd.endpoint, cluster_name, "worker", "early", {"address": "tcp://127.0.0.1:1"}).start(
            join_timeout=30)
        assert time.monotonic() - t >= 1.0 and reg.alive()
        client = connect(etcd.endpoint)
        assert [kv.key for kv in client.get_prefix_response(members_prefix(cluster_name)).kvs] == [reg.key.encode()]
        client.close()
        reg.stop()
    finally:
        late.join()
        etcd.stop()
    never = Registration(etcd.endpoint, cluster_name, "worker", "never", {})
    with pytest.raises(RuntimeError, match=rf"etcd at {etcd.endpoint} unreachable for 1 s"):
        never.start(join_timeout=1)
