"""Nodes die mid-job (kill -9 of real processes) and the job still finishes whole:
every id exactly once, the same output as an undisturbed run."""

from __future__ import annotations

import signal

import pytest
from job_check import PARAMS, WORKER_ARGS, check_whole, wait_for_progress, workload

import shoal
from shoal.nodes.leader import Election
from shoal.rpc import RemoteError, RpcClient

FAST_RPC = {"SHOAL_RPC_TIMEOUT_S": "2"}  # a dead peer costs 2 s per try, not 10


def cluster(tiny_model, tmp_path, **kw) -> shoal.LocalCluster:
    kw.setdefault("env", FAST_RPC)
    return shoal.LocalCluster(tiny_model, state_dir=tmp_path / "c", policy="mb", worker_args=WORKER_ARGS, **kw)


def kill(c: shoal.LocalCluster, name: str) -> None:
    proc = c.process(name)
    proc.send_signal(signal.SIGKILL)
    proc.wait()


def test_scheduler_leader_killed_standby_takes_over(tiny_model, tmp_path):
    items = workload()
    with cluster(tiny_model, tmp_path, schedulers=2) as c:
        client = shoal.Client(c.router, timeout=3)
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


def test_worker_killed_mid_job(tiny_model, tmp_path):
    items = workload()
    with cluster(tiny_model, tmp_path, workers=2) as c:
        job = shoal.Client(c.router, timeout=3).submit(items, params=PARAMS.to_dict())
        assert wait_for_progress(job, 3) < len(items)
        kill(c, "worker-0")
        results = job.wait(timeout=240)
    check_whole(tiny_model, items, results)


def test_storage_killed_and_restarted_on_its_directory(tiny_model, tmp_path):
    items = workload()
    with cluster(tiny_model, tmp_path) as c:
        job = shoal.Client(c.router, timeout=3).submit(items, params=PARAMS.to_dict())
        assert wait_for_progress(job, 3) < len(items)
        kill(c, "storage-0")
        c.restart("storage-0")
        results = job.wait(timeout=240)
    check_whole(tiny_model, items, results)


def test_router_killed_client_reattaches_by_job_id(tiny_model, tmp_path):
    items = workload()
    with cluster(tiny_model, tmp_path) as c:
        job = shoal.Client(c.router, timeout=3).submit(items, params=PARAMS.to_dict(), job_key="via-router")
        first = []
        for rec in job.results():
            first.append(rec)
            if len(first) == 3:
                break
        kill(c, "router-0")
        router = c.restart("router-0")
        client = shoal.Client(router, timeout=3)
        again = client.submit(items, params=PARAMS.to_dict(), job_key="via-router")  # the key still names it
        assert again.id == job.id
        rest = list(client.job(job.id).results(offset=len(first)))
    check_whole(tiny_model, items, first + rest)
