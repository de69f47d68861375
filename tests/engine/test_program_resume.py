"""Programs restarted from checkpoints on another runtime: the same output as a run
that was never interrupted, and clear errors for checkpoints that cannot be used."""

from __future__ import annotations

import random

import pytest

from shoal.nodes.worker.engine import EngineConfig, LLMEngine
from shoal.nodes.worker.program_runner import ProgramRunner
from shoal.output_compare import compare_generations
from shoal.program import Generate, program


@program("test.resume_two")
def resume_two(item, max_tokens=12):
    first = yield Generate(prompt_token_ids=item["ids"], max_tokens=max_tokens, ignore_eos=True, return_margins=True)
    second = yield Generate(prompt_token_ids=item["ids"] + first.token_ids[-2:], max_tokens=max_tokens,
                            ignore_eos=True, return_margins=True, temperature=0.8, seed=3)
    return {"generations": [first.to_dict(), second.to_dict()]}


@program("test.dice")
def dice(item):
    first = yield Generate(prompt_token_ids=item["ids"], max_tokens=3, ignore_eos=True)
    n = 2 + random.randrange(1000)  # chosen by chance, not by the results: not deterministic
    yield Generate(prompt_token_ids=item["ids"] + first.token_ids, max_tokens=n, ignore_eos=True)
    return {}


ITEMS = [{"id": f"r{k}", "ids": [(11 * k + j) % 500 for j in range(2 + k)]} for k in range(6)]


@pytest.fixture(scope="module")
def engine(tiny_model):
    return LLMEngine(tiny_model, EngineConfig(policy="mb"))


def interrupted(engine, program_name, steps: int, checkpoint_tokens: int = 4) -> dict:
    """Runs `steps` steps, then abandons the run; returns the last checkpoint per item."""
    runner = ProgramRunner(engine, checkpoint_tokens=checkpoint_tokens)
    for item in ITEMS:
        runner.admit("job", program_name, {}, item)
    for _ in range(steps):
        runner.step()
    latest = {entry["id"]: entry["state"] for _, entry in runner.checkpoints}
    runner.drop_all()
    return latest


def resumed(engine, program_name, states: dict) -> tuple[dict, ProgramRunner]:
    runner = ProgramRunner(engine)
    out = {}
    for item in ITEMS:
        for _, rec, _ in runner.admit("job", program_name, {}, item, states.get(item["id"])):
            out[rec["id"]] = rec
    while runner.has_work():
        for _, rec, _ in runner.step():
            out[rec["id"]] = rec
    return out, runner


@pytest.mark.parametrize("steps", [6, 20])  # inside the first Generate; inside the second
def test_resumed_from_checkpoints_equals_an_uninterrupted_run(engine, steps):
    alone = {r["id"]: r for r in ProgramRunner(engine).run("job", "test.resume_two", ITEMS)}
    states = interrupted(engine, "test.resume_two", steps)
    assert states, "no checkpoint was taken"
    out, runner = resumed(engine, "test.resume_two", states)
    assert runner.counters["sequences.resumed"] == len(states) and runner.counters["tokens.restored"] > 0
    for item in ITEMS:
        cmp = compare_generations(out[item["id"]]["generations"], alone[item["id"]]["generations"])
        assert cmp, f"{item['id']}: {cmp.detail}"


def test_a_program_that_is_not_deterministic_fails_at_resume(engine):
    # Seeded apart from the resumed run's draws: left to whatever state the tests before
    # left, a draw matched its replay now and then and that sequence resumed cleanly.
    random.seed(1)
    states = interrupted(engine, "test.dice", steps=8, checkpoint_tokens=1)
    after_first = {k: s for k, s in states.items() if s["journal"]}
    assert after_first, "no checkpoint after the first operation"
    random.seed(12345)
    out, _ = resumed(engine, "test.dice", after_first)
    for sid in after_first:
        assert out[sid]["finish_reason"] == "error"
        assert f"sequence {sid!r}" in out[sid]["error"] and "not deterministic" in out[sid]["error"]


def test_unusable_checkpoints_fail_only_their_sequence(engine):
    states = interrupted(engine, "test.resume_two", steps=6)
    ids = sorted(states)
    bad = {ids[0]: {**states[ids[0]], "fingerprint": "Qwen3ForCausalLM:another"},
           ids[1]: {k: v for k, v in states[ids[1]].items() if k != "journal"},
           ids[2]: {**states[ids[2]], "version": "7"},
           ids[3]: {**states[ids[3]], "generated": {"output_token_ids": ["x"]}}}
    out, _ = resumed(engine, "test.resume_two", {**states, **bad})
    assert "state is from model 'Qwen3ForCausalLM:another'" in out[ids[0]]["error"]
    assert "truncated or malformed (no journal)" in out[ids[1]]["error"]
    assert "version '7'" in out[ids[2]]["error"]
    assert "truncated or malformed (generated tokens)" in out[ids[3]]["error"]
    assert all(f"sequence {sid!r}" in out[sid]["error"] for sid in bad)
    assert all("error" not in out[it["id"]] for it in ITEMS if it["id"] not in bad)


@pytest.mark.parametrize("with_kv", [True, False])
def test_sequences_moved_back_and_forth_between_engines_mid_operation(engine, tiny_model, with_kv):
    """Export (suspend, take out, KV in the canonical layout) and admit on another
    engine, every few steps, inside and between operations: the same output."""
    alone = {r["id"]: r for r in ProgramRunner(engine).run("job", "test.resume_two", ITEMS)}
    runners = [ProgramRunner(engine), ProgramRunner(LLMEngine(tiny_model, EngineConfig(policy="mb")))]
    for item in ITEMS:
        runners[0].admit("job", "test.resume_two", {}, item)
    out, here, moves, shipped = {}, 0, 0, 0
    while runners[here].has_work():
        for _ in range(3):
            for _, rec, _ in runners[here].step():
                out[rec["id"]] = rec
        there = 1 - here
        for key in list(runners[here].coros):
            state, kv = runners[here].export(key, with_kv=with_kv)
            shipped += kv is not None
            item = next(it for it in ITEMS if it["id"] == key[1])
            assert runners[there].admit("job", "test.resume_two", {}, item, state, kv) == []
            moves += 1
        here = there
    assert moves > len(ITEMS) and (shipped > 0) == with_kv
    for item in ITEMS:
        cmp = compare_generations(out[item["id"]]["generations"], alone[item["id"]]["generations"])
        assert cmp, f"{item['id']}: {cmp.detail}"


@program("test.extend")
def extend(item):
    """The second prompt extends the first context: history, answer, then more."""
    first = yield Generate(prompt_token_ids=item["ids"], max_tokens=40, ignore_eos=True)
    history = item["ids"] + first.token_ids
    second = yield Generate(prompt_token_ids=history + [7, 8, 9], max_tokens=4, ignore_eos=True)
    return {"history": len(history), "second": second.token_ids}


def test_a_next_operation_reuses_the_kv_of_the_context_it_extends(tiny_model):
    """Between operations the sequence's full KV blocks stay in the prefix cache, so a
    Generate whose prompt extends the context prefills only what is new."""
    eng = LLMEngine(tiny_model, EngineConfig(policy="mb"))
    item = {"id": "x", "ids": list(range(1, 70))}
    rec = ProgramRunner(eng).run("job", "test.extend", [item])[0]
    bs = eng.config.block_size
    reusable = (rec["history"] // bs) * bs  # the full blocks of the history
    assert eng.stats.prompt_tokens_cached >= reusable > len(item["ids"])  # generated tokens too
    assert eng.stats.prompt_tokens_computed <= len(item["ids"]) + (rec["history"] + 3 - reusable)
