"""Steps that fail (`LLMEngine._recover`, `step_failures.py`): a job neither hangs nor
loses work. Whatever point of a step raised, the engine steps again and every sequence
gives the output of a run without failures; the worker's runner ends the one sequence a
failure follows, alone, with an error that names it, caps the step when the device runs
out of memory, and says when the device is lost."""

from __future__ import annotations

import dataclasses
import random

import pytest
import torch

from shoal.nodes.worker.engine import EngineConfig, LLMEngine
from shoal.nodes.worker.program_runner import ProgramRunner
from shoal.nodes.worker.step_failures import DeviceLost
from shoal.nodes.worker.step_faults import inject_step_errors
from shoal.output_compare import compare_results
from shoal.sampling import SamplingParams

ARGS = {"ignore_eos": True, "return_margins": True, "temperature": 0.7, "seed": 3}


def items(n: int = 12, seed: int = 4) -> list[dict]:
    r = random.Random(seed)
    return [{"id": f"x{i}", "prompt_token_ids": [r.randrange(10, 500) for _ in range(r.randint(1, 40))],
             "max_tokens": r.randint(3, 30)} for i in range(n)]


def engine(model, overlap: bool) -> LLMEngine:
    return LLMEngine(model, EngineConfig(device="cpu", policy="mb", async_scheduling=overlap,
                                         max_num_batched_tokens=64))


@pytest.fixture(scope="module")
def reference(tiny_model) -> dict:
    return {r["id"]: r for r in ProgramRunner(engine(tiny_model, False)).run("job", "generate", items(), ARGS)}


def assert_same(got: dict, reference: dict, skip=()) -> None:
    assert sorted(got) == sorted(reference)
    for sid, rec in got.items():
        if sid not in skip:
            cmp = compare_results(rec, reference[sid])
            assert cmp, f"{sid}: {cmp.detail}"


@pytest.mark.parametrize("overlap", [False, True], ids=["in-order", "async"])
def test_the_sequence_a_failure_follows_ends_alone_and_the_rest_match(tiny_model, reference, overlap):
    eng = engine(tiny_model, overlap)
    inject_step_errors(eng, {"error": "bug", "item": "x5"})
    runner = ProgramRunner(eng)
    got = {r["id"]: r for r in runner.run("job", "generate", items(), ARGS)}
    bad = got["x5"]
    assert bad["finish_reason"] == "error" and "'x5'" in bad["error"], bad
    assert "failed 2 times with this sequence alone" in bad["error"] and "ValueError: injected bug" in bad["error"]
    assert_same(got, reference, skip={"x5"})
    assert runner.counters["sequences.failed_by_step"] == 1 and runner.counters["errors.step"] >= 3
    assert eng.step_cap is None  # found: steps run as before
    assert eng.blocks.num_used == 0 and not eng.seqs  # nothing held or leaked


@pytest.mark.parametrize("overlap", [False, True], ids=["in-order", "async"])
def test_out_of_memory_caps_the_step_and_loses_nothing(tiny_model, reference, overlap):
    eng = engine(tiny_model, overlap)
    inject_step_errors(eng, {"error": "oom", "above_rows": 3})
    runner = ProgramRunner(eng)
    got = {r["id"]: r for r in runner.run("job", "generate", items(), ARGS)}
    assert all("error" not in r for r in got.values()), [r for r in got.values() if "error" in r]
    assert_same(got, reference)
    assert runner.counters["errors.step"] >= 1
    assert 1 <= runner.step_failures.memory_cap <= 3 and eng.step_cap == runner.step_failures.memory_cap


def test_a_lost_device_is_said_to_the_worker(tiny_model):
    eng = engine(tiny_model, False)
    inject_step_errors(eng, {"error": "cuda", "after_steps": 2})
    runner = ProgramRunner(eng)
    for item in items(4):
        runner.admit("job", "generate", ARGS, item)
    with pytest.raises(DeviceLost, match="illegal memory access"):
        for _ in range(10):
            runner.step()


def fail_now_and_then(eng: LLMEngine, name: str, every: int) -> list:
    """Makes the engine's method `name` raise on every `every`-th call."""
    method, calls, failed = getattr(eng, name), [0], []

    def failing(*a, **kw):
        calls[0] += 1
        if calls[0] % every == 0:
            failed.append(calls[0])
            raise RuntimeError("injected")
        return method(*a, **kw)

    setattr(eng, name, failing)
    return failed


@pytest.mark.parametrize("overlap", [False, True], ids=["in-order", "async"])
@pytest.mark.parametrize("where", ["_sample_ahead", "_record_figures", "_finish"])
def test_a_step_failing_anywhere_is_stepped_again_to_the_same_outputs(tiny_model, overlap, where):
    """Raised while sampling (after the model advanced the sequences: before, the next
    step found nothing to compute for them and the engine spun forever) or while reading
    the tokens back (after they were appended, before their figures; or while finishing
    the sequences they end, some finished and some not, grammars among them): the read
    is taken back, the outputs made before the failure are returned, and every sequence
    ends as a run without failures does."""
    r = random.Random(9)
    prompts = [[r.randrange(10, 500) for _ in range(r.randint(1, 40))] for _ in range(16)]
    params = [SamplingParams(max_tokens=r.randint(1, 30), temperature=0.0 if i % 2 else 0.9, seed=5,
                             ignore_eos=True, return_margins=i % 3 != 0, logprobs=2 if i % 4 == 0 else None)
              for i in range(16)]
    params[3] = dataclasses.replace(params[3], repetition_penalty=1.3)  # sampled after the read (async)
    for i in (5, 10):  # a grammar that ends some sequences early, its state consumed in the read
        params[i] = dataclasses.replace(params[i], regex="[a-z]{2,6}( [a-z]{2,6}){0,2}", ignore_eos=False)
    ref = engine(tiny_model, False).generate(prompts, params)
    eng = engine(tiny_model, overlap)
    for i, (p, sp) in enumerate(zip(prompts, params)):
        eng.add_request(i, prompt_token_ids=p, params=sp)
    failed = fail_now_and_then(eng, where, every=5)
    done, steps = {}, 0
    while eng.has_unfinished():
        steps += 1
        assert steps < 2000, "the engine does not get anywhere"
        try:
            outs = eng.step()
        except RuntimeError as e:
            assert str(e) == "injected"
            outs = eng.take_finished()
        for o in outs:
            assert o.seq_id not in done, f"{o.seq_id} finished twice"
            done[o.seq_id] = o
    assert len(failed) >= 3
    for i in range(16):
        cmp = compare_results(done[i], ref[i])
        assert cmp, f"sequence {i}: {cmp.detail}"
        assert len(done[i].token_ids) == len(ref[i].token_ids) and done[i].finish_reason == ref[i].finish_reason
        if params[i].logprobs is not None:
            assert len(done[i].logprobs) == len(done[i].token_ids)
    assert eng.blocks.num_used == 0
