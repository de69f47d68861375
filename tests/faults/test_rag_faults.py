"""Iterative retrieval under faults, with real processes: a sequence moved in the
middle of a hop, a worker killed with kill -9, a storage node holding index shards
killed; the job comes out whole and the same, or (one replica) fails clearly."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

import shoal
from shoal.output_compare import compare_rag
from shoal.transport.rpc import RpcClient
from shoal.cli.index_build import build_index

from rag_setup import embed_corpus, rag_items

TESTS = Path(__file__).resolve().parent.parent
PARAMS = {"k": 3, "trace": True, "stop": [], "ignore_eos": True, "index": "r2"}


def counters(c, name: str) -> dict:
    return RpcClient(c.nodes[name][2]).request("StatsQuery", {}, timeout=5)["stats"]


def wait_until(pred, timeout: float, what: str) -> None:
    end = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < end, f"timed out waiting for {what}"
        time.sleep(0.05)


def items(corpus):
    # Longer thoughts (no stop, no EOS) keep each hop busy long enough to be hit mid-way.
    return [{**it, "thought_tokens": [16 + 8 * ((i + h) % 4) for h in range(4)]} for i, it in enumerate(rag_items(corpus, 8))]


@pytest.fixture(scope="module")
def faults_cluster(tiny_model, minilm, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ragf")
    env = {"PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
    args = ["--budget", "64", "--threads", "1", "--checkpoint-tokens", "8", "--retrieve-timeout", "4"]
    with shoal.LocalCluster(tiny_model, encoder=minilm, workers=2, storage_nodes=3, state_dir=tmp / "c", policy="mb",
                            env=env, worker_args=args) as c:
        client = shoal.Client(c.router, reply_timeout=5)
        corpus, emb = embed_corpus(client, tmp / "data", minilm)
        build_index(emb, tmp / "index3", 3)
        build_index(emb, tmp / "index2", 2)
        r1 = client.load_index(tmp / "index3", "r1", replicas=1)
        r2 = client.load_index(tmp / "index2", "r2", replicas=2)
        assert r1["placement"] == [["storage-0"], ["storage-1"], ["storage-2"]], r1
        assert "storage-1" in r2["placement"][0] and "storage-1" not in r2["placement"][1], r2
        work = items(corpus)
        ref = {r["id"]: r for r in client.submit(work, program="ircot", params=PARAMS).wait(timeout=240)}
        assert all("error" not in r for r in ref.values()), ref
        yield c, client, work, ref


def same(got: list, ref: dict, work: list) -> None:
    assert sorted(r["id"] for r in got) == sorted(it["id"] for it in work)
    for rec in got:
        assert "error" not in rec, rec
        cmp = compare_rag(rec, ref[rec["id"]])
        assert cmp, f"{rec['id']}: {cmp.detail}"


def test_moved_mid_hop_and_worker_killed(faults_cluster):
    c, client, work, ref = faults_cluster

    def total(counter: str) -> int:
        return sum(counters(c, w)["counters"].get(counter, 0) for w in ("worker-0", "worker-1"))

    before = total("checkpoints")
    job = client.submit(work, program="ircot", params=PARAMS)
    wait_until(lambda: total("checkpoints") >= before + 6, 60, "some hops under way")
    imported = total("sequences.imported")
    assert client.migrate(job.id, "worker-1")["moving"] > 0
    wait_until(lambda: total("sequences.imported") > imported, 30, "sequences moved to worker-1")
    same(job.wait(timeout=240), ref, work)

    job = client.submit(work, program="ircot", params=PARAMS)
    storage = RpcClient(c.nodes["storage-0"][2])
    wait_until(lambda: any(storage.request("ReadInput", {"job_id": job.id, "offset": 0, "limit": 100,
                                                        "pending_only": True})["checkpoints"]), 60, "a checkpoint")
    c.process("worker-0").send_signal(signal.SIGKILL)
    c.process("worker-0").wait()
    assert job.status()["done"] < len(work), "the job finished before the kill"
    same(job.wait(timeout=240), ref, work)


def test_storage_node_with_shards_killed(faults_cluster):
    c, client, work, ref = faults_cluster
    workers = [w for w in ("worker-0", "worker-1", "worker-2") if w in c.nodes and c.process(w).poll() is None]

    def searches() -> int:
        return sum(counters(c, w)["retrieve"]["searches"] for w in workers)

    before = searches()
    job = client.submit(work, program="ircot", params=PARAMS)
    # Killed after the first hop's search, not the first answer: every item runs its
    # hops in step with the others (their thoughts add up alike), so by the first answer
    # no search may be left to fail over.
    wait_until(lambda: searches() > before, 60, "a first search")
    c.process("storage-1").send_signal(signal.SIGKILL)
    c.process("storage-1").wait()
    assert job.status()["done"] < len(work), "the job finished before the kill"
    same(job.wait(timeout=240), ref, work)  # two replicas: retrieval failed over
    assert sum(counters(c, w)["retrieve"]["failovers"] for w in workers) > 0

    # One replica: the shard storage-1 held is gone; its sequences fail with a clear
    # error after the retrieve timeout, and the job ends.
    t0 = time.monotonic()
    failed = client.submit(work[:3], program="ircot", params={**PARAMS, "index": "r1"}).wait(timeout=120)
    assert time.monotonic() - t0 < 60
    for rec in failed:
        assert "index 'r1'" in rec["error"] and ("shard 1" in rec["error"] or "lacks shards [1]" in rec["error"]), rec
