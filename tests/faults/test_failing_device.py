"""A worker's device fails under a real cluster (`SHOAL_FAULTS` step_error, injected
into the worker's model runs): a lost device makes the worker leave at once (its lease
revoked, its sequences placed again), and a bug one item triggers ends that item alone
with an error while the job finishes."""

from __future__ import annotations

import orjson
from job_check import PARAMS, WORKER_ARGS, check_whole, reference, workload

import shoal
from shoal.nodes.membership import MemberView
from shoal.output_compare import compare_results

FAST_RPC = {"SHOAL_RPC_TIMEOUT_S": "2"}


def faulty(spec: dict) -> dict:
    return {**FAST_RPC, "SHOAL_FAULTS": orjson.dumps({"step_error": spec}).decode()}


def test_a_worker_whose_device_is_lost_leaves_and_its_work_finishes_elsewhere(tiny_model, tmp_path):
    items = workload(16)
    with shoal.LocalCluster(tiny_model, state_dir=tmp_path / "c", policy="mb", worker_args=WORKER_ARGS,
                            env=faulty({"error": "cuda", "after_steps": 6})) as c:
        job = shoal.Client(c.router, reply_timeout=3).submit(items, params=PARAMS.to_dict())
        assert c.process("worker-0").wait(timeout=60) == 5  # left, not crashed nor spinning
        view = MemberView(c.etcd.endpoint, c.cluster).start()
        assert "worker-0" not in view.snapshot("worker")  # revoked, not left to expire
        view.stop()
        assert job.status()["state"] == "running"
        c.restart("worker-0", env=FAST_RPC)
        results = job.wait(timeout=240)
    check_whole(tiny_model, items, results)


def test_an_item_that_breaks_the_step_ends_alone_and_the_job_finishes(tiny_model, tmp_path):
    items = workload(16)
    with shoal.LocalCluster(tiny_model, state_dir=tmp_path / "c", policy="mb", worker_args=WORKER_ARGS,
                            env=faulty({"error": "bug", "item": "s3"})) as c:
        job = shoal.Client(c.router, reply_timeout=3).submit(items, params=PARAMS.to_dict())
        results = job.wait(timeout=240)
        assert c.process("worker-0").poll() is None  # the worker lives on
    by_id = {r["id"]: r for r in results}
    assert sorted(by_id) == sorted(it["id"] for it in items) and len(results) == len(items)
    bad = by_id.pop("s3")
    assert bad.get("finish_reason") == "error" and "injected bug" in bad["error"] and "'s3'" in bad["error"], bad
    ref = reference(tiny_model, items)
    for sid, rec in by_id.items():
        cmp = compare_results(rec, ref[sid])
        assert cmp, f"{sid}: {cmp.detail}"


def test_out_of_memory_at_larger_steps_caps_them_and_shoal_nodes_says_so(tiny_model, tmp_path):
    import subprocess
    import sys

    items = workload(16)
    with shoal.LocalCluster(tiny_model, state_dir=tmp_path / "c", policy="mb", worker_args=WORKER_ARGS,
                            env=faulty({"error": "oom", "above_rows": 3})) as c:
        results = shoal.Client(c.router, reply_timeout=3).submit(items, params=PARAMS.to_dict()).wait(timeout=240)
        out = subprocess.run([sys.executable, "-m", "shoal.cli", "nodes", "--dir", str(c.dir)],
                             capture_output=True, text=True, timeout=60)
    check_whole(tiny_model, items, results)
    worker = next(ln for ln in out.stdout.splitlines() if ln.startswith("worker"))
    cap = int(worker.split("at most ")[1].split()[0])
    assert 1 <= cap <= 3 and "sequences/step since steps failed" in worker, worker
