"""A job end to end through real processes — etcd, router, scheduler, storage and
workers — with the SDK: every id exactly once, the same output as the engine
in-process, idempotent on the job key."""

from __future__ import annotations

import random
import time
from pathlib import Path

import pytest

import shoal
from shoal.nodes.worker.engine import EngineConfig, LLMEngine
from shoal.output_compare import compare_results
from shoal.sampling import SamplingParams


def wait_until(cond, timeout: float) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.05)
    return cond()


def send_bad_messages_to_every_node(cluster):
    """While the job runs: each node answers every bad message with an Error."""
    from test_storage_node import BAD

    from shoal.nodes.membership import MemberView
    from shoal.transport.rpc import RpcClient

    view = MemberView(cluster.etcd.endpoint, cluster.cluster).start()
    members = view.snapshot()
    view.stop()
    assert {m.role for m in members.values()} == {"router", "scheduler", "storage", "worker"}
    for m in members.values():
        c = RpcClient(m.info["address"])
        for name, (frames, _) in BAD.items():
            reply = c.raw(frames)
            assert reply.type == "Error", (m.role, name)
        assert c.request("Ping", {"sent_at": 3.0})["sent_at"] == 3.0, m.role
        c.close()


def check_input_by_path(client, tmp_path):
    """A job whose input storage reads from a path; a bad file is refused with its line."""
    path = tmp_path / "by-path.jsonl"
    path.write_bytes(b'{"id": "x1", "prompt_token_ids": [3, 4]}\n{"id": "x2", "prompt": "The"}\n')
    job = client.submit(input_path=path, params={"max_tokens": 2})
    assert job.total == 2
    assert sorted(r["id"] for r in job.wait(timeout=60)) == ["x1", "x2"]
    path.write_bytes(b'{"id": "x1", "prompt": "a"}\n{"id": "x1", "prompt": "b"}\n')
    with pytest.raises(shoal.transport.rpc.RemoteError, match=r"bad_input: .*by-path.jsonl:2: duplicate id 'x1'"):
        client.submit(input_path=path)


@pytest.mark.parametrize("workers", [1, 2])
def test_generate_job_through_the_cluster(tiny_model, tmp_path, workers, monkeypatch):
    r = random.Random(21)
    prompts = [[r.randrange(511) for _ in range(r.randint(1, 100))] for _ in range(30)]
    params = SamplingParams(max_tokens=16, ignore_eos=True, return_margins=True)
    items = [{"id": f"q{i}", "prompt_token_ids": p} for i, p in enumerate(prompts)]
    # Past every check storage can make (it knows no vocabulary): it fails on a worker.
    items.append({"id": "bad", "prompt_token_ids": [10**6]})
    if workers == 2:  # this job's input goes up in chunks, as a large one would
        monkeypatch.setattr(shoal.sdk.client, "INLINE_BYTES", 512)
        monkeypatch.setattr(shoal.sdk.client, "CHUNK_BYTES", 700)
    with shoal.LocalCluster(tiny_model, workers=workers, state_dir=tmp_path / "c", policy="mb", worker_threads=1) as cluster:
        client = shoal.Client(cluster.router)
        if workers == 2:  # an upload that fails part-way, then the same key with a shorter input: only that input runs
            longer = items + [{"id": f"extra{i}", "prompt_token_ids": [1] * 50} for i in range(30)]
            with pytest.raises(TypeError):
                client.submit(longer + [{"id": "unencodable", "prompt": {1, 2}}], params=params.to_dict(), job_key="job-A")
        job = client.submit(items, params=params.to_dict(), job_key="job-A")
        assert job.total == len(items)
        again = client.submit(items, params=params.to_dict(), job_key="job-A")
        assert again.id == job.id
        if workers == 1:
            send_bad_messages_to_every_node(cluster)
            check_input_by_path(client, tmp_path)
            # Nodes beside the workers run one BLAS / OpenMP thread; workers keep theirs.
            for name, want in (("storage-0", b"OPENBLAS_NUM_THREADS=1"), ("scheduler-0", b"OMP_NUM_THREADS=1")):
                assert want in Path(f"/proc/{cluster.process(name).pid}/environ").read_bytes().split(b"\0"), name
            assert b"OMP_NUM_THREADS=1" not in Path(f"/proc/{cluster.process('worker-0').pid}/environ").read_bytes().split(b"\0")
        results = job.wait(timeout=180)
        status = job.status()
        assert (status["state"], status["done"], status["failed"]) == ("done", 31, 1) and status["tokens_per_s"] > 0
        shards = tmp_path / "c" / "storage" / "jobs" / job.id
        assert wait_until(lambda: (shards / "results.parquet").exists(), 10), "no compacted shards"
        assert (shards / "results.jsonl").read_bytes().count(b"\n") == len(items)
        uploads = tmp_path / "c" / "storage" / "uploads"  # the job's upload went; the abandoned one waits for its sweep
        left = list(uploads.iterdir()) if uploads.exists() else []
        assert len(left) == (1 if workers == 2 else 0), left
        # Reattach by id and read again from an offset: the same records.
        tail = list(client.job(job.id).results(offset=len(results) - 5))
        assert tail == results[-5:]
    ids = [rec["id"] for rec in results]
    assert sorted(ids) == sorted(it["id"] for it in items) and len(ids) == len(set(ids))
    by_id = {rec["id"]: rec for rec in results}
    assert by_id["bad"]["finish_reason"] == "error"
    ref = LLMEngine(tiny_model, EngineConfig(policy="mb")).generate(prompts, params)
    for i, o in enumerate(ref):
        rec = by_id[f"q{i}"]
        cmp = compare_results(rec, o)
        assert cmp, f"q{i}: {cmp.detail}"
