"""Seeded sampled sequences that change hands between real worker processes at token
positions the test chooses (a fault plan parks each one there; no timing decides):
moved with their KV, or resumed from a checkpoint after kill -9. Each must draw the same
uniform at every position as an undisturbed single-engine run, from the same
distribution, and so produce the same tokens (the shared comparator's draw rule)."""

from __future__ import annotations

import signal
import time

import orjson

import shoal
from shoal.output_compare import DRAW_RULE, compare_results
from shoal.transport.rpc import RpcClient
from shoal.sampling import SamplingParams

PARAMS = SamplingParams(max_tokens=28, ignore_eos=True, return_margins=True, temperature=0.8, top_p=0.9, seed=11)
# Prompts of 9 tokens, so positions 7, 8 and 23, 24 put the sequence either side of a
# 16-token KV block boundary.
PARK_AT = {"m0": 0, "m1": 1, "m2": 7, "m3": 8, "m4": 23, "m5": 24, "m6": 27}


def items(ids) -> list[dict]:
    return [{"id": i, "prompt_token_ids": [(37 * k + 5 * n) % 500 + 1 for n in range(9)]} for k, i in enumerate(ids)]


def reference(model, work: list[dict]) -> dict:
    from shoal.nodes.worker.engine import EngineConfig, LLMEngine

    outs = LLMEngine(model, EngineConfig(policy="mb")).generate(
        [it["prompt_token_ids"] for it in work], PARAMS, seq_ids=[it["id"] for it in work])
    return {it["id"]: o for it, o in zip(work, outs)}


def check_same_draws(results: list, ref: dict) -> None:
    assert sorted(r["id"] for r in results) == sorted(ref)
    for rec in results:
        o = ref[rec["id"]]
        assert [d[0] for d in rec["draws"]] == [d[0] for d in o.draws], f"{rec['id']}: another uniform somewhere"
        cmp = compare_results(rec, o)
        assert cmp.rule == DRAW_RULE and cmp, f"{rec['id']}: {cmp.detail}"


def cluster(model, tmp_path, workers: int, park_at: dict, extra: list[str] = ()) -> shoal.LocalCluster:
    env = {"SHOAL_FAULTS": orjson.dumps({"park_at": park_at}).decode(), "SHOAL_RPC_TIMEOUT_S": "2"}
    # No stealing: only the test moves sequences, so a parked one is never carried off
    # (and unparked) before the test sees it.
    return shoal.LocalCluster(model, workers=workers, state_dir=tmp_path / "c", policy="mb", env=env,
                              worker_args=["--threads", "1", *extra], scheduler_args=["--no-steal"])


def stats(c: shoal.LocalCluster, worker: str) -> dict:
    return RpcClient(c.nodes[worker][2]).request("StatsQuery", timeout=5)["stats"]


def test_moved_with_kv_at_chosen_positions(tiny_model, tmp_path):
    work = items(PARK_AT)
    workers = ("worker-0", "worker-1")
    with cluster(tiny_model, tmp_path, 2, PARK_AT) as c:
        client = shoal.Client(c.router)
        job = client.submit(work, params=PARAMS.to_dict())
        moved: set = set()
        end = time.monotonic() + 90
        while len(moved) < len(PARK_AT):
            assert time.monotonic() < end, f"parked and moved so far: {sorted(moved)}"
            for w in workers:
                for sid in stats(c, w)["sequences"]["parked"]:
                    if sid not in moved:
                        other = workers[1 - workers.index(w)]
                        assert client.migrate(job.id, other, [sid])["moving"] == 1
                        moved.add(sid)
            time.sleep(0.05)
        results = job.wait(timeout=120)
        counters = [stats(c, w)["counters"] for w in workers]
    assert sum(k.get("sequences.imported", 0) for k in counters) == len(PARK_AT)
    assert sum(k.get("kv.shipped", 0) for k in counters) >= len(PARK_AT) - 1  # m0 has no KV yet
    check_same_draws(results, reference(tiny_model, work))


def test_resumed_from_checkpoints_after_kill_9_at_chosen_positions(tiny_model, tmp_path):
    """Every token is checkpointed; the worker is killed while each sequence is parked at
    its position, so another worker continues each from exactly there, without KV."""
    park = {k: v for k, v in PARK_AT.items() if v > 0}  # a checkpoint holds at least one token
    work = items(park)
    with cluster(tiny_model, tmp_path, 1, park, ["--checkpoint-tokens", "1"]) as c:
        job = shoal.Client(c.router, reply_timeout=3).submit(work, params=PARAMS.to_dict())
        storage = RpcClient(c.nodes["storage-0"][2])

        def checkpointed() -> dict:
            page = storage.request("ReadInput", {"job_id": job.id, "offset": 0, "limit": 100, "pending_only": True})
            return {it["id"]: len(((cp or {}).get("generated") or {}).get("output_token_ids", ()))
                    for it, cp in zip(page["items"], page["checkpoints"])}

        end = time.monotonic() + 90
        while checkpointed() != park:
            assert time.monotonic() < end, f"checkpoints at {checkpointed()}, parked at {park}"
            time.sleep(0.1)
        proc = c.process("worker-0")
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        c.add_worker("worker-1")
        results = job.wait(timeout=120)
        counters = stats(c, "worker-1")["counters"]
    assert counters.get("sequences.resumed", 0) == len(park), counters
    assert counters.get("tokens.restored", 0) == sum(park.values()), counters
    check_same_draws(results, reference(tiny_model, work))
