"""Nodes die mid-job (kill -9 of real processes) and the job still finishes whole:
every id exactly once, the same output as an undisturbed run."""

from __future__ import annotations

import signal

import pytest
from job_check import PARAMS, WORKER_ARGS, check_whole, wait_for_progress, workload

import shoal
from shoal.nodes.leader import Election
from shoal.transport.rpc import RemoteError, RpcClient

FAST_RPC = {"SHOAL_RPC_TIMEOUT_S": "2"}  # a dead peer costs 2 s per try, not 10


def cluster(tiny_model, tmp_path, **kw) -> shoal.LocalCluster:
    kw.setdefault("env", FAST_RPC)
    kw.setdefault("worker_args", WORKER_ARGS)
    return shoal.LocalCluster(tiny_model, state_dir=tmp_path / "c", policy="mb", **kw)


def kill(c: shoal.LocalCluster, name: str) -> None:
    proc = c.process(name)
    proc.send_signal(signal.SIGKILL)
    proc.wait()


def test_scheduler_leader_killed_standby_takes_over(tiny_model, tmp_path):
    items = workload()
    with cluster(tiny_model, tmp_path, schedulers=2) as c:
        client = shoal.Client(c.router, reply_timeout=3)
        job = client.submit(items, params=PARAMS.to_dict(), job_key="failover")
        election = Election(c.etcd.endpoint, c.cluster, "observer")
        old_leader, old_epoch = election.current()
        assert wait_for_progress(job, 3) < len(items), "the job finished before the kill"
        kill(c, old_leader)
        results = job.wait(timeout=240)
        new_leader, new_epoch = election.current()
        assert new_leader != old_leader and new_epoch > old_epoch
        # The old leader's epoch is fenced off at the worker and at storage.
        worker = RpcClient(c.nodes["worker-0"][2])
        with pytest.raises(RemoteError, match="stale_epoch"):
            worker.request("AssignSequences", {"epoch": old_epoch, "job_id": job.id, "sequences": []})
        storage = RpcClient(c.nodes["storage-0"][2])
        with pytest.raises(RemoteError, match="stale_epoch"):
            storage.request("LogJob", {"epoch": old_epoch, "job": {"job_id": job.id, "job_key": "failover", "program": "generate",
                                                                   "params": {}, "total": 1, "state": "running"}})
        assert job.status()["state"] == "done"
    check_whole(tiny_model, items, results)


def test_worker_killed_mid_job_restarts_from_checkpoints(tiny_model, tmp_path):
    """The worker records each sequence's state every 8 tokens; when it is killed
    mid-generation, a worker started after it continues its sequences from there, not
    from scratch."""
    import time

    items = workload()
    with cluster(tiny_model, tmp_path, workers=1, worker_args=[*WORKER_ARGS, "--checkpoint-tokens", "8"]) as c:
        job = shoal.Client(c.router, reply_timeout=3).submit(items, params=PARAMS.to_dict())
        storage = RpcClient(c.nodes["storage-0"][2])
        end = time.monotonic() + 60
        while not any(storage.request("ReadInput", {"job_id": job.id, "offset": 0, "limit": 100,
                                                    "pending_only": True})["checkpoints"]):
            assert time.monotonic() < end, "no checkpoint of an unfinished sequence reached storage"
            time.sleep(0.05)
        kill(c, "worker-0")
        assert job.status()["done"] < len(items)
        c.add_worker("worker-1")
        results = job.wait(timeout=240)
        survivor = RpcClient(c.nodes["worker-1"][2]).request("StatsQuery")["stats"]["counters"]
    assert survivor.get("sequences.resumed", 0) > 0 and survivor.get("tokens.restored", 0) > 0, survivor
    check_whole(tiny_model, items, results)


def test_storage_killed_and_restarted_on_its_directory(tiny_model, tmp_path):
    items = workload()
    with cluster(tiny_model, tmp_path) as c:
        job = shoal.Client(c.router, reply_timeout=3).submit(items, params=PARAMS.to_dict())
        assert wait_for_progress(job, 3) < len(items)
        kill(c, "storage-0")
        c.restart("storage-0")
        results = job.wait(timeout=240)
    check_whole(tiny_model, items, results)


def test_router_killed_client_reattaches_by_job_id(tiny_model, tmp_path):
    items = workload()
    with cluster(tiny_model, tmp_path) as c:
        job = shoal.Client(c.router, reply_timeout=3).submit(items, params=PARAMS.to_dict(), job_key="via-router")
        first = []
        for rec in job.results():
            first.append(rec)
            if len(first) == 3:
                break
        kill(c, "router-0")
        router = c.restart("router-0")
        client = shoal.Client(router, reply_timeout=3)
        again = client.submit(items, params=PARAMS.to_dict(), job_key="via-router")  # the key still names it
        assert again.id == job.id
        rest = list(client.job(job.id).results(offset=len(first)))
    check_whole(tiny_model, items, first + rest)


def test_frozen_scheduler_rejoins_and_the_router_keeps_serving(tiny_model, tmp_path):
    """SIGSTOP the only scheduler past its lease: the router still answers other
    requests at once (each request is its own task); after SIGCONT the scheduler finds
    its leadership gone, campaigns again under a new epoch, rebuilds and finishes the job."""
    import threading
    import time

    items = workload(16)
    with cluster(tiny_model, tmp_path) as c:
        client = shoal.Client(c.router, reply_timeout=3)
        job = client.submit(items, params=PARAMS.to_dict(), job_key="frozen")
        _, epoch = Election(c.etcd.endpoint, c.cluster, "observer").current()
        sched = c.process("scheduler-0")
        sched.send_signal(signal.SIGSTOP)
        try:
            stuck = []

            def ask_the_frozen_scheduler():
                try:
                    RpcClient(c.router).request("JobStatusQuery", {"job_id": job.id}, timeout=30)
                except RemoteError as e:
                    stuck.append(e.code)

            waiting = threading.Thread(target=ask_the_frozen_scheduler)
            waiting.start()
            time.sleep(0.3)
            router = RpcClient(c.router)
            t = time.monotonic()
            assert router.request("Ping", {"sent_at": 1.0})["sent_at"] == 1.0
            assert router.request("UploadChunk", {"upload_id": "u-side", "index": 0}, {"data": b"{}\n"})["index"] == 0
            assert time.monotonic() - t < 1.0
            time.sleep(4)  # past the 3 s lease
        finally:
            sched.send_signal(signal.SIGCONT)
        results = job.wait(timeout=240)
        waiting.join(timeout=60)
        assert stuck == ["unavailable"]  # the router gave up on the frozen scheduler and said so
        _, new_epoch = Election(c.etcd.endpoint, c.cluster, "observer").current()
        assert new_epoch > epoch
    check_whole(tiny_model, items, results)


def test_frozen_worker_loses_its_work_and_rejoins_without_duplicates(tiny_model, tmp_path):
    """SIGSTOP a worker (a wedged process) past its lease: its work goes to the other
    worker; after SIGCONT it drops what it held and registers as a new incarnation."""
    import time

    from shoal.nodes.membership import MemberView

    # Half the generations long, so the frozen worker still holds work when it wakes:
    # with only short ones it could finish all of it before its lease thread noticed
    # the loss, leaving nothing to drop. (The short half gives the progress waited for.)
    items = [{**it, "max_tokens": 400} if i % 2 else it for i, it in enumerate(workload(30))]
    with cluster(tiny_model, tmp_path, workers=2) as c:
        job = shoal.Client(c.router, reply_timeout=3).submit(items, params=PARAMS.to_dict())
        view = MemberView(c.etcd.endpoint, c.cluster).start()
        before = view.snapshot("worker")["worker-0"].info["incarnation"]
        assert wait_for_progress(job, 3) < len(items)
        frozen = c.process("worker-0")
        frozen.send_signal(signal.SIGSTOP)
        assert view.wait_for(lambda m: "worker-0" not in m, timeout=15), "the frozen worker's lease did not expire"
        time.sleep(1)
        frozen.send_signal(signal.SIGCONT)
        assert view.wait_for(lambda m: "worker-0" in m and m["worker-0"].info["incarnation"] != before, timeout=15)
        results = job.wait(timeout=240)
        stats = RpcClient(c.nodes["worker-0"][2]).request("StatsQuery")["stats"]["counters"]
        view.stop()
    assert stats.get("sequences.dropped_on_rejoin", 0) > 0
    check_whole(tiny_model, items, results)


def test_wedged_step_loop_revokes_its_lease_and_exits(tiny_model, tmp_path):
    """The step loop stops (injected) while the keep-alive thread runs: the watchdog
    revokes the lease and stops the worker; a restarted worker finishes the job."""
    import orjson

    from shoal.nodes.membership import MemberView

    items = workload(16)
    env = {**FAST_RPC, "SHOAL_FAULTS": orjson.dumps({"stall_after_steps": 6}).decode()}
    with cluster(tiny_model, tmp_path, env=env, worker_args=[*WORKER_ARGS, "--stall-timeout", "2"]) as c:
        job = shoal.Client(c.router, reply_timeout=3).submit(items, params=PARAMS.to_dict())
        worker = c.process("worker-0")
        assert worker.wait(timeout=60) == 3  # the watchdog's exit code
        view = MemberView(c.etcd.endpoint, c.cluster).start()
        assert "worker-0" not in view.snapshot("worker")  # revoked, not left to expire
        assert job.status()["state"] == "running"
        c.restart("worker-0", env=FAST_RPC)
        results = job.wait(timeout=240)
        view.stop()
    check_whole(tiny_model, items, results)


@pytest.mark.timeout(300)
def test_etcd_away_30_s_then_back_to_placing_work_within_5_s(tiny_model, tmp_path):
    """etcd stops for 30 s mid-job (ten lease TTLs) and comes back on its data. Meanwhile
    the scheduler and the worker, past their own lease deadlines, take no requests (none
    can know it is still a member, or the leader), but the worker's engine finishes what
    it holds and storage, whose writes are idempotent, stores those results and serves
    them through the router. Once etcd answers, the control plane places work again
    within 5 s (the leader's old key let go of, not waited out; clients reconnect at
    once), under a new epoch, and the job finishes whole."""
    import time

    items = workload(900)  # more than the worker may hold: the rest waits on the scheduler
    with cluster(tiny_model, tmp_path) as c:
        client = shoal.Client(c.router, reply_timeout=3)
        job = client.submit(items, params=PARAMS.to_dict(), job_key="etcd-away")
        _, epoch = Election(c.etcd.endpoint, c.cluster, "observer").current()
        worker, storage = RpcClient(c.nodes["worker-0"][2]), RpcClient(c.nodes["storage-0"][2])

        def assigned() -> int:
            return worker.request("StatsQuery", timeout=5)["stats"]["counters"]["sequences.assigned"]

        def stored() -> int:
            return storage.request("ResultCountQuery", {"job_id": job.id}, timeout=5)["records"]

        wait_for_progress(job, 3)
        c.etcd.stop()
        before = assigned()
        at_stop = stored()
        assert before < len(items), "every item was placed before etcd stopped"
        time.sleep(30)
        during = stored()
        assert during > at_stop  # the worker's finished results landed while etcd was away
        read = client._request("Subscribe", {"job_id": job.id, "offset": 0})  # and are read through the router
        assert read["available"] == during and len(read["records"]) > 0
        with pytest.raises(TimeoutError):  # the worker, past its lease deadline, takes no requests
            worker.request("StatsQuery", timeout=1)

        c.etcd.start()
        back = time.monotonic()
        while True:
            try:
                if assigned() > before:
                    break
            except TimeoutError:  # the worker, still to see etcd back
                pass
            assert time.monotonic() - back < 5.0, "no work placed within 5 s of etcd's return"
            time.sleep(0.05)
        results = job.wait(timeout=240)
        _, new_epoch = Election(c.etcd.endpoint, c.cluster, "observer").current()
        assert new_epoch > epoch
    check_whole(tiny_model, items, results)
