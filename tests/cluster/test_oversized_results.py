"""A result or checkpoint too large for one message fails its own item, never the job
or the worker: before, the worker re-sent it forever and its other results stalled."""

from __future__ import annotations

import os
from pathlib import Path

import shoal
from shoal.program import Generate

TESTS = str(Path(__file__).resolve().parents[1]) + os.pathsep + str(Path(__file__).resolve().parent)


def big_for_some(item):
    out = yield Generate(prompt_token_ids=[3, 4, 5], max_tokens=2)
    if item["big"]:
        return {"blob": "x" * 2_000_000}  # past the 1 MiB a message header may carry
    return {"tokens": out.token_ids}


def test_an_oversized_result_fails_only_its_item(tiny_model, tmp_path):
    work = [{"id": k, "big": k in (1, 4)} for k in range(8)]
    env = {"PYTHONPATH": TESTS + os.pathsep + os.environ.get("PYTHONPATH", "")}
    with shoal.LocalCluster(tiny_model, state_dir=tmp_path / "c", policy="mb", env=env) as c:
        client = shoal.Client(c.router)
        got = {r["id"]: r for r in client.submit(work, program="test_oversized_results:big_for_some").wait(timeout=120)}
        # The worker still delivers: a second job after it finishes.
        again = client.submit([{"id": 0, "big": False}], program="test_oversized_results:big_for_some").wait(timeout=60)
    assert sorted(got) == list(range(8))
    for k in (1, 4):
        assert got[k]["finish_reason"] == "error" and "result of 2000" in got[k]["error"], got[k]
        assert "exceeds the largest result a message carries" in got[k]["error"]
    assert all(len(got[k]["tokens"]) == 2 for k in (0, 2, 3, 5, 6, 7))
    assert len(again[0]["tokens"]) == 2
