"""A job over a flaky network: every node's sockets drop, duplicate, delay and reorder
messages from a seeded plan. Delivery is at least once, effects are idempotent, so the
job still finishes with every id exactly once and the undisturbed output."""

from __future__ import annotations

import orjson
import pytest
from job_check import PARAMS, WORKER_ARGS, check_whole, workload

import shoal
from shoal.transport.faults import FaultPlan, FaultySocket
from shoal.nodes.membership import MemberView
from shoal.transport.rpc import RpcClient

# Rates high enough that a quick job (~100 faultable sends when the engine is fast) still
# meets every kind: at drop 0.04 a run on a fast machine saw none (P(0) ~ e^-4).
PLAN = {"seed": 11, "drop": 0.1, "duplicate": 0.15, "delay": 0.1, "delay_ms": 60, "reorder": 0.1}


def test_job_finishes_whole_under_injected_faults(tiny_model, tmp_path):
    items = workload(24)
    env = {"SHOAL_FAULTS": orjson.dumps(PLAN).decode(), "SHOAL_RPC_TIMEOUT_S": "1.5"}
    with shoal.LocalCluster(tiny_model, workers=2, state_dir=tmp_path / "c", policy="mb", env=env,
                            worker_args=WORKER_ARGS) as c:
        job = shoal.Client(c.router, reply_timeout=2).submit(items, params=PARAMS.to_dict())
        results = job.wait(timeout=280)
        view = MemberView(c.etcd.endpoint, c.cluster).start()
        injected = {}
        for m in view.snapshot().values():
            stats = RpcClient(m.info["address"]).request("StatsQuery", retries=5, timeout=2)["stats"]
            for kind, n in stats["faults_injected"].items():
                injected[kind] = injected.get(kind, 0) + n
        view.stop()
    assert all(injected[k] > 0 for k in ("drop", "duplicate", "delay", "reorder")), injected
    check_whole(tiny_model, items, results)


class Recorder:
    def __init__(self):
        self.sent = []

    def send_multipart(self, frames, *a, **kw):
        self.sent.append([bytes(f) for f in frames])


def header(msg_type: str, n: int) -> bytes:
    return orjson.dumps({"type": msg_type, "n": n})


def test_fault_plan_is_seeded_and_per_type():
    def run(seed):
        sock = FaultySocket(Recorder(), FaultPlan(seed=seed, drop=0.2, duplicate=0.2, reorder=0.2,
                                                  types=frozenset({"WriteResults"})), routed=False)
        for i in range(200):
            sock.send_multipart([header("WriteResults" if i % 2 else "Ping", i)])
        return sock._sock.sent, sock.injected

    (a, ia), (b, ib), (c, _) = run(1), run(1), run(2)
    assert a == b and ia == ib and a != c  # the same seed, the same faults
    pings = [orjson.loads(f[0])["n"] for f in a if orjson.loads(f[0])["type"] == "Ping"]
    assert pings == list(range(0, 200, 2))  # other types pass untouched, in order
    writes = [orjson.loads(f[0])["n"] for f in a if orjson.loads(f[0])["type"] == "WriteResults"]
    order = [orjson.loads(f[0])["n"] for f in a]
    assert len(set(writes)) < 100 and len(writes) != len(set(writes)) and order != sorted(order)
    assert ia["drop"] > 0 and ia["duplicate"] > 0 and ia["reorder"] > 0


def test_bad_plans_are_refused(monkeypatch):
    monkeypatch.setenv("SHOAL_FAULTS", '{"drop": 1.5}')
    with pytest.raises(ValueError, match="drop must be a probability"):
        FaultPlan.from_env()
    monkeypatch.setenv("SHOAL_FAULTS", '{"drop": 0.1, "bogus": 1}')
    with pytest.raises(ValueError, match="not a valid fault plan"):
        FaultPlan.from_env()
