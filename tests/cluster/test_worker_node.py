"""A worker node process with a storage node process: assigned sequences come back
through storage as the same output as the engine in-process, refused input is recorded
as an error result, and control messages are answered while the model runs."""

from __future__ import annotations

import random
import subprocess
import sys
import time

import pytest

from shoal.nodes.worker.engine import EngineConfig, LLMEngine
from shoal.output_compare import compare_results
from shoal.transport.rpc import RpcClient
from shoal.sampling import SamplingParams


def spawn(cmd, prefix):
    proc = subprocess.Popen([sys.executable, *cmd], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    line = proc.stdout.readline().strip()
    assert line.startswith(prefix), line
    return proc, line.split(" ", 1)[1]


@pytest.fixture
def worker(tmp_path, tiny_model, etcd_endpoint, cluster_name):
    st, st_addr = spawn(["-m", "shoal.nodes.storage.storage_node", "--dir", str(tmp_path / "st")], "storage:")
    wk, wk_addr = spawn(["-m", "shoal.nodes.worker.worker_node", "--model", str(tiny_model), "--storage", st_addr,
                         "--policy", "mb", "--etcd", etcd_endpoint, "--cluster", cluster_name, "--node-id", "w-1",
                         "--step-log", str(tmp_path / "steps.log")],
                        "worker:")
    yield wk_addr, st_addr
    for p in (wk, st):
        p.kill()
        p.wait()


def test_assigned_sequences_land_in_storage_with_engine_outputs(worker, tiny_model, tmp_path):
    wk_addr, st_addr = worker
    r = random.Random(11)
    prompts = [[r.randrange(511) for _ in range(r.randint(1, 120))] for _ in range(24)]
    params = SamplingParams(max_tokens=24, ignore_eos=True, return_margins=True)
    c = RpcClient(wk_addr)
    engine_fp = LLMEngine(tiny_model, EngineConfig(policy="mb")).fingerprint
    assert c.request("Hello", {"role": "client", "node_id": "t", "model": engine_fp})["node_id"] == "w-1"
    seqs = [{"seq_id": i, "item": {"id": i, "prompt_token_ids": p}} for i, p in enumerate(prompts)]
    seqs.append({"seq_id": "bad", "item": {"id": "bad", "prompt_token_ids": []}})
    assign = {"epoch": 1, "job_id": "job1", "program": "generate", "args": params.to_dict()}
    ack = c.request("AssignSequences", {**assign, "sequences": seqs[:12]})
    assert ack["accepted"] == 12
    # A protocol 1.2 scheduler's assignment (the generate program's fields inline) runs too.
    legacy = [{"seq_id": s["seq_id"], "prompt_token_ids": s["item"]["prompt_token_ids"], "params": params.to_dict()}
              for s in seqs[12:]]
    c.request("AssignSequences", {"epoch": 1, "job_id": "job1", "sequences": legacy})
    # Control messages are answered while the engine works.
    rtts = []
    store = RpcClient(st_addr)
    deadline = time.monotonic() + 120
    got = []
    while time.monotonic() < deadline:
        t = time.perf_counter()
        c.request("Ping", {"sent_at": t}, timeout=5)
        rtts.append(time.perf_counter() - t)
        got = store.request("Subscribe", {"job_id": "job1", "offset": 0})["records"]
        if len(got) == len(seqs):
            break
        time.sleep(0.05)
    assert len(got) == len(seqs), f"{len(got)} of {len(seqs)} results arrived"
    by_id = {rec["id"]: rec for rec in got}
    assert by_id["bad"]["finish_reason"] == "error" and "empty prompt" in by_id["bad"]["error"]
    ref = LLMEngine(tiny_model, EngineConfig(policy="mb")).generate(prompts, params)
    for i, o in enumerate(ref):
        cmp = compare_results(by_id[i], o)
        assert cmp, f"sequence {i}: {cmp.detail}"
    assert len(rtts) > 0 and max(rtts) < 5
    stats = c.request("StatsQuery", {})["stats"]
    assert stats["counters"]["sequences.assigned"] == len(seqs) and stats["counters"]["sequences.refused"] == 1
    # The KV cache was sized by default: half the memory free at start, which a tiny model cannot use.
    eng = stats["engine"]
    assert eng["kv_cache_reason"].startswith("auto: 50% of the ") and "capped at what 256 full contexts" in eng["kv_cache_reason"]
    assert 0 < eng["kv_cache_bytes"] < 1 << 30
    # --step-log: a line per step, its end time (now-ish) and its length, as the engine counted them.
    # (The last step's line may land a moment after its results: read until they agree.)
    for _ in range(50):
        lines = [tuple(map(float, ln.split())) for ln in (tmp_path / "steps.log").read_text().splitlines()]
        steps = c.request("StatsQuery", {})["stats"]["engine"]["steps"]
        if len(lines) == steps:
            break
        time.sleep(0.1)
    assert len(lines) == steps > 0
    assert all(0 < dt < 60 and abs(end - time.time()) < 300 for end, dt in lines)
    assert [end for end, _ in lines] == sorted(end for end, _ in lines)


def test_model_mismatch_is_refused_at_hello(worker):
    wk_addr, _ = worker
    c = RpcClient(wk_addr)
    reply = c.raw(__import__("shoal.protocol.codec", fromlist=["encode"]).encode(
        "Hello", {"role": "scheduler", "node_id": "s", "model": "Qwen3ForCausalLM:other"}))
    assert reply.type == "Error" and "runs model" in reply["message"]
