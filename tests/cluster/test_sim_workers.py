"""Simulated workers (`shoal.nodes.sim_worker_host`: the real protocol, no engine) run
a job through the real scheduler, router and storage, and through a leader killed with
SIGKILL mid-job: every item is stored once, and the standby rebuilds what each worker
holds. The control-plane benchmark stands on these endpoints."""

from __future__ import annotations

import signal
import time

import shoal
from shoal.cluster.node_process import spawn_node
from shoal.nodes.membership import MemberView
from shoal.transport.rpc import RpcClient

FAST_RPC = {"SHOAL_RPC_TIMEOUT_S": "2"}


def stats(address: str) -> dict:
    return RpcClient(address).request("StatsQuery", {}, timeout=10)["stats"]


def test_simulated_workers_finish_a_job_through_a_leader_kill(tmp_path):
    with shoal.LocalCluster(model="sim", workers=0, schedulers=2, state_dir=tmp_path / "c", env=FAST_RPC) as c:
        hosts = [spawn_node("simhost", f"simhost-{h}", [
            "--etcd", c.etcd.endpoint, "--cluster", c.cluster, "--workers", "4", "--prefix", f"h{h}-",
            "--max-seqs", "8", "--report-every", "0.05"], tmp_path / "logs", env=FAST_RPC, die_with_parent=True)
            for h in range(2)]
        try:
            view = MemberView(c.etcd.endpoint, c.cluster).start()
            assert view.wait_for(lambda m: sum(x.role == "worker" for x in m.values()) == 8, 30)
            view.stop()
            items = [{"id": i, "sim_s": 0.2 + 0.05 * (i % 9), "sim_tokens": 10} for i in range(600)]
            client = shoal.Client(c.router, reply_timeout=3)
            job = client.submit(items, program="bench.sim:program", job_key="sim")
            while job.status()["done"] < 60:
                time.sleep(0.1)
            leader = next(f"scheduler-{i}" for i in range(2) if stats(c.nodes[f"scheduler-{i}"][2])["leader"])
            c.process(leader).send_signal(signal.SIGKILL)
            c.process(leader).wait()
            assert job.status()["done"] < len(items), "the job finished before the kill"
            results = job.wait(timeout=90)
            assert sorted(r["id"] for r in results) == list(range(len(items)))
            assert job.status()["state"] == "done"
            standby = next(f"scheduler-{i}" for i in range(2) if f"scheduler-{i}" != leader)
            st = stats(c.nodes[standby][2])
            assert st["leader"] and st["takeover_s"] > 0
            assert sum(st["decision_hist"]) > 0  # it measured report -> assignment
            counters = [stats(address)["endpoint_counters"] for _, address in hosts]
            assert sum(x.get("sequences.assigned", 0) + x.get("sequences.imported", 0) for x in counters) >= len(items)
            assert sum(x.get("results.reported", 0) for x in counters) >= len(items)
        finally:
            for proc, _ in hosts:
                proc.terminate()
                proc.wait(10)
