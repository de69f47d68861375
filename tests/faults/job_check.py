"""The job every fault test runs, and the check that it came out whole: every id
exactly once, and the same output as the engine undisturbed (the shared comparator)."""

from __future__ import annotations

import random
import time

import orjson

from shoal.output_compare import compare_results
from shoal.sampling import SamplingParams

PARAMS = SamplingParams(max_tokens=24, ignore_eos=True, return_margins=True)
# Small steps make the job last long enough to be hit mid-way on a 2-core machine.
WORKER_ARGS = ["--budget", "64", "--threads", "1"]


def workload(n: int = 40, seed: int = 5) -> list[dict]:
    r = random.Random(seed)
    # Lengths vary so that results trickle in and a fault can land mid-job.
    return [{"id": f"s{i}", "prompt_token_ids": [r.randrange(511) for _ in range(r.randint(1, 48))],
             "max_tokens": r.randint(2, 64)} for i in range(n)]


_reference: dict = {}


def reference(model, items) -> dict:
    """The undisturbed output, computed once per model and workload."""
    key = (str(model), orjson.dumps(items))
    if key not in _reference:
        from shoal.nodes.worker.engine import EngineConfig, LLMEngine

        eng = LLMEngine(model, EngineConfig(policy="mb"))
        params = [SamplingParams.from_dict({**PARAMS.to_dict(), "max_tokens": it["max_tokens"]}) for it in items]
        outs = eng.generate([it["prompt_token_ids"] for it in items], params)
        _reference[key] = {it["id"]: o for it, o in zip(items, outs)}
    return _reference[key]


def check_whole(model, items, results) -> None:
    ids = [r["id"] for r in results]
    assert len(ids) == len(set(ids)), f"duplicates: {sorted(i for i in set(ids) if ids.count(i) > 1)}"
    assert sorted(ids) == sorted(it["id"] for it in items), "missing or unknown ids"
    ref = reference(model, items)
    for rec in results:
        o = ref[rec["id"]]
        cmp = compare_results(rec, o)
        assert cmp, f"{rec['id']}: {cmp.detail}"


def wait_for_progress(job, at_least: int, timeout: float = 120) -> int:
    """Waits until `at_least` results are stored; returns how many there are."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        done = job.status()["done"]
        if done >= at_least:
            return done
        time.sleep(0.1)
    raise TimeoutError(f"fewer than {at_least} results after {timeout}s")
