"""A constrained, sampled job with logprobs through real worker processes, one worker
drained mid-generation: its sequences move with their tokens and KV, their grammars are
rebuilt from those tokens where they land, and every output equals an undisturbed
single-engine run, satisfies its constraint where it stopped, and carries its logprobs."""

from __future__ import annotations

import random
import re

import jsonschema
import orjson
import pytest

import shoal
from shoal.output_compare import compare_results
from shoal.sampling import SamplingParams
from tests.cluster.test_migration import cluster, counters, wait_until

SCHEMA = {"type": "object", "additionalProperties": False, "required": ["id", "tag"],
          "properties": {"id": {"type": "integer", "minimum": 0, "maximum": 9999},
                         "tag": {"type": "string", "maxLength": 16}}}
REGEX = r"([a-z]+ ){1,8}[0-9]{2}"


def items(n: int) -> list[dict]:
    r = random.Random(4)
    out = []
    for i in range(n):
        it = {"id": f"c{i}", "prompt_token_ids": [r.randrange(511) for _ in range(r.randint(2, 30))],
              "max_tokens": 60}
        it.update({"json_schema": SCHEMA} if i % 2 else {"regex": REGEX})
        out.append(it)
    return out


PARAMS = SamplingParams(max_tokens=60, return_margins=True, temperature=0.9, seed=21, logprobs=2)


def reference(model, work: list[dict]) -> dict:
    from shoal.nodes.worker.engine import EngineConfig, LLMEngine

    eng = LLMEngine(model, EngineConfig(policy="mb"))
    each = [SamplingParams.from_dict({**PARAMS.to_dict(), **{k: v for k, v in it.items() if k not in ("id", "prompt_token_ids")}})
            for it in work]
    outs = eng.generate([it["prompt_token_ids"] for it in work], each, seq_ids=[it["id"] for it in work])
    return {it["id"]: o for it, o in zip(work, outs)}


@pytest.mark.timeout(400)
def test_a_constrained_job_drained_mid_generation(tiny_model, tmp_path):
    work = items(120)
    with cluster(tiny_model, tmp_path, workers=2) as c:
        client = shoal.Client(c.router)
        job = client.submit(work, params=PARAMS.to_dict())
        wait_until(lambda: counters(c, "worker-1").get("sequences.assigned", 0) > 0, 60, "work on worker-1")
        assert job.status()["done"] < len(work)
        client.drain("worker-1")
        assert c.process("worker-1").wait(timeout=120) == 0
        results = job.wait(timeout=300)
        imported = counters(c, "worker-0").get("sequences.imported", 0)
    assert imported > 0, "nothing moved off the drained worker"
    ref = reference(tiny_model, work)
    by_id = {it["id"]: it for it in work}
    assert sorted(r["id"] for r in results) == sorted(by_id)
    stopped = 0
    for rec in results:
        o = ref[rec["id"]]
        cmp = compare_results(rec, o)
        assert cmp, f"{rec['id']}: {cmp.detail}"
        assert len(rec["logprobs"]) == len(rec["token_ids"])
        if cmp.diverged_at is None:
            assert [e["logprob"] for e in rec["logprobs"]] == pytest.approx([e["logprob"] for e in o.logprobs], abs=1e-4)
        if rec["finish_reason"] == "stop":
            stopped += 1
            it = by_id[rec["id"]]
            if "json_schema" in it:
                jsonschema.validate(orjson.loads(rec["text"]), SCHEMA)
            else:
                assert re.fullmatch(REGEX, rec["text"]), rec["text"]
    assert stopped >= len(work) // 2
