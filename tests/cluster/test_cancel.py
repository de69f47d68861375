"""A cancelled job stops on the workers too: the sequences a worker holds are dropped
(their KV freed, nothing more of them stored), and the next job gets the whole worker
at once instead of waiting behind them."""

from __future__ import annotations

import time

import shoal
from shoal.transport.rpc import RpcClient


def worker_stats(c: shoal.LocalCluster) -> dict:
    return RpcClient(c.nodes["worker-0"][2]).request("StatsQuery", timeout=5)["stats"]


def test_a_cancelled_job_stops_on_its_worker(tiny_model, tmp_path):
    with shoal.LocalCluster(tiny_model, workers=1, state_dir=tmp_path / "c") as c:
        client = shoal.Client(c.router)
        # Long enough that, run on, it would take minutes.
        long = client.submit([{"id": i, "prompt_token_ids": [1 + i, 2]} for i in range(48)],
                             params={"max_tokens": 1800, "ignore_eos": True})
        end = time.monotonic() + 60
        while worker_stats(c)["sequences"]["resident"] == 0:
            assert time.monotonic() < end, "the job never reached the worker"
            time.sleep(0.1)
        assert long.cancel()["state"] == "cancelled"
        end = time.monotonic() + 10
        while (st := worker_stats(c))["sequences"]["resident"] > 0:
            assert time.monotonic() < end, f"the worker still runs the cancelled job: {st['sequences']}"
            time.sleep(0.1)
        dropped = st["counters"].get("sequences.dropped", 0)
        done = long.status()["done"]
        # Cancelled a moment after it started: nearly all of it was still running, and dropped.
        assert dropped >= 40 and done + dropped <= 48, (done, dropped)
        stored = len(list(long.results()))
        short = client.submit([{"id": i, "prompt_token_ids": [7, 8 + i]} for i in range(4)], params={"max_tokens": 4})
        assert sorted(r["id"] for r in short.wait(timeout=60)) == [0, 1, 2, 3]
        assert len(list(long.results())) == stored  # nothing more of it was stored
