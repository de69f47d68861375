"""kill -9 in the middle of an embedding job — of the worker, of the storage node, of the
whole local cluster — and then resume: every text is in the output exactly once, and
the vectors equal an undisturbed run's."""

from __future__ import annotations

import time

import numpy as np
import pytest
from embed_corpus import write_corpus

import shoal
from shoal.sdk.embeddings import EmbeddingSet
from shoal.embedding_output import read_manifest
from shoal.scheduler.superbatch import pack

SIZES = [45, 3, 75, 20, 0, 110, 6, 38, 65, 30]  # 392 texts
SETTINGS = {"b_min": 16, "n_max": 8}
SUPERBATCHES = len(pack([(f"p{i}", n) for i, n in enumerate(SIZES)], **SETTINGS))
# One SuperBatch in flight and one thread: the job lasts long enough to be hit mid-way.
CLUSTER = {"scheduler_args": ["--superbatches-in-flight", "1"], "worker_threads": 1,
           "env": {"SHOAL_RPC_TIMEOUT_S": "2"}}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return write_corpus(tmp_path_factory.mktemp("corpus"), SIZES, seed=11)


@pytest.fixture(scope="module")
def undisturbed(corpus, minilm, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("undisturbed")
    with shoal.LocalCluster(encoder=minilm, state_dir=tmp / "c", **CLUSTER) as c:
        job = shoal.Client(c.router).embed(corpus[0], tmp / "out", minilm, **SETTINGS)
        assert job.wait_until_done(timeout=240)["state"] == "done"
    return {p: EmbeddingSet(tmp / "out").matrix(p) for p in corpus[1]}


def wait_for_superbatches(out, at_least: int, timeout: float = 120) -> int:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        n = len(read_manifest(out)[1])
        if n >= at_least:
            return n
        time.sleep(0.05)
    raise TimeoutError(f"fewer than {at_least} SuperBatches written after {timeout}s")


def check_same(out, corpus, undisturbed) -> None:
    result = EmbeddingSet(out)
    assert result.missing() == {}
    ids = [e["id"] for e in result.entries]
    assert len(ids) == len(set(ids)), "a SuperBatch was written twice"
    assert result.rows == sum(SIZES)
    for part, rows in corpus[1].items():
        got_ids, got = result.matrix(part)
        ref_ids, ref = undisturbed[part]
        assert got_ids == ref_ids == [i for i, _ in rows]
        assert np.allclose(got, ref, atol=1e-6), part


@pytest.mark.parametrize("victim", ["worker-0", "storage-0"])
def test_node_killed_mid_job_then_restarted(victim, corpus, undisturbed, minilm, tmp_path):
    out = tmp_path / "out"
    with shoal.LocalCluster(encoder=minilm, state_dir=tmp_path / "c", **CLUSTER) as c:
        job = shoal.Client(c.router).embed(corpus[0], out, minilm, **SETTINGS)
        written = wait_for_superbatches(out, 3)
        assert written < SUPERBATCHES and job.status()["state"] == "running", "the job finished before the kill"
        c.process(victim).kill()
        c.process(victim).wait()
        c.restart(victim)
        assert job.wait_until_done(timeout=240)["state"] == "done"
    check_same(out, corpus, undisturbed)


def test_whole_cluster_killed_then_the_job_resumes_on_a_new_one(corpus, undisturbed, minilm, tmp_path):
    out = tmp_path / "out"
    c = shoal.LocalCluster(encoder=minilm, state_dir=tmp_path / "c1", **CLUSTER).start()
    try:
        shoal.Client(c.router).embed(corpus[0], out, minilm, **SETTINGS)
        wait_for_superbatches(out, 3)
        for p in [*c.procs, c.etcd.proc]:  # every process at once, nothing shuts down cleanly
            p.kill()
    finally:
        c.stop()
    before = read_manifest(out)[2]
    assert 0 < len(read_manifest(out)[1]) < SUPERBATCHES, "the job finished before the kill"
    with shoal.LocalCluster(encoder=minilm, state_dir=tmp_path / "c2", **CLUSTER) as c2:
        job = shoal.Client(c2.router).embed(corpus[0], out, minilm, **SETTINGS)
        assert job.detail["done"] > 0  # it resumed: what the manifest holds is skipped
        assert job.wait_until_done(timeout=240)["state"] == "done"
    assert read_manifest(out)[2] > before
    check_same(out, corpus, undisturbed)
