"""n > 1: several samples of one prompt, each drawn as a single request with its own seed,
the prompt prefilled once."""

from __future__ import annotations

import pytest

from shoal.nodes.worker.engine import EngineConfig, LLMEngine
from shoal.nodes.worker.program_runner import ProgramRunner


def test_n_samples_equal_n_single_requests_with_the_matching_seeds(tiny_model):
    prompt = list(range(3, 70))  # 67 tokens: four full blocks of 16 and a partial one
    params = {"max_tokens": 12, "temperature": 1.0, "seed": 5, "ignore_eos": True, "logprobs": 1}
    engine = LLMEngine(tiny_model, EngineConfig())
    runner = ProgramRunner(engine)
    (rec,) = runner.run("j", "generate", [{"id": "q", "prompt_token_ids": prompt, "n": 3}], params)
    assert [c["finish_reason"] for c in rec["choices"]] == ["length"] * 3
    # The prompt was computed once; the other two samples read its full blocks.
    assert engine.stats.prompt_tokens_cached >= 2 * 64
    assert engine.stats.prompt_tokens_computed <= len(prompt) + 2 * (len(prompt) - 64)

    single = ProgramRunner(LLMEngine(tiny_model, EngineConfig()))
    for j, choice in enumerate(rec["choices"]):
        (one,) = single.run(f"s{j}", "generate", [{"id": "q", "prompt_token_ids": prompt}], {**params, "seed": 5 + j})
        assert choice["token_ids"] == one["token_ids"]
        assert [e["logprob"] for e in choice["logprobs"]] == pytest.approx([e["logprob"] for e in one["logprobs"]],
                                                                          abs=1e-5)
    assert len({tuple(c["token_ids"]) for c in rec["choices"]}) == 3  # sampled: the seeds differ


def test_bad_n_fails_only_its_item(tiny_model):
    runner = ProgramRunner(LLMEngine(tiny_model, EngineConfig()))
    recs = runner.run("j", "generate", [{"id": "a", "prompt_token_ids": [1, 2], "n": 0},
                                        {"id": "b", "prompt_token_ids": [1, 2], "max_tokens": 2}])
    assert recs[0]["finish_reason"] == "error" and "n must be" in recs[0]["error"]
    assert len(recs[1]["token_ids"]) == 2


def test_a_program_asks_for_a_json_answer_on_its_last_hop(tiny_model):
    """Generate inside a program takes the same constraint fields as an item."""
    import orjson

    from shoal.program import Generate, program

    schema = {"type": "object", "required": ["answer"], "additionalProperties": False,
              "properties": {"answer": {"type": "string", "maxLength": 8}}}

    @program("test_two_hops_then_json")
    def two_hops(item, **_):
        first = yield Generate(prompt_token_ids=item["prompt_token_ids"], max_tokens=6, ignore_eos=True)
        last = yield Generate(prompt_token_ids=item["prompt_token_ids"] + first.token_ids, max_tokens=40,
                              json_schema=schema, logprobs=1)
        return {"thought": first.text, "answer": orjson.loads(last.text) if last.finish_reason == "stop" else None,
                "logprobs": len(last.logprobs)}

    runner = ProgramRunner(LLMEngine(tiny_model, EngineConfig()))
    recs = runner.run("j", "test_two_hops_then_json", [{"id": i, "prompt_token_ids": [i + 1, 7, 9]} for i in range(4)])
    answered = [r for r in recs if r["answer"] is not None]
    assert len(answered) >= 3
    for r in answered:
        assert set(r["answer"]) == {"answer"} and len(r["answer"]["answer"]) <= 8
        assert r["logprobs"] > 0
