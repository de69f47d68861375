"""The compute thread blocks on another executor only when nothing else can run: never
right after a step that ran (what it finished may have emptied the engine while the next
assignment waits; a 20 ms wait per step held one-token jobs to two thirds of a core)."""

from __future__ import annotations

import pytest

from shoal.nodes.worker.engine import EngineConfig, LLMEngine
from shoal.nodes.worker.program_runner import ProgramRunner
from shoal.program import Generate, Retrieve, program


class RecordingExecutor:
    """A retrieve executor that never answers and records every idle wait."""

    def __init__(self):
        self.waits: list[float] = []
        self.submitted: list = []

    def submit(self, key, op) -> None:
        self.submitted.append(key)

    def poll(self) -> list:
        return []

    def wait(self, timeout: float) -> None:
        self.waits.append(timeout)

    def abort(self, key) -> None:
        pass


@program("test.retrieve_forever")
def retrieve_forever(item):
    yield Retrieve(query="q", k=1)
    return {}


@pytest.fixture(scope="module")
def engine(tiny_model):
    return LLMEngine(tiny_model, EngineConfig(policy="mb"))


def test_no_idle_wait_after_a_step_that_emptied_the_engine(engine):
    ex = RecordingExecutor()
    runner = ProgramRunner(engine, executors={"retrieve": ex, "embed": ex})
    runner.admit("job", "test.retrieve_forever", {}, {"id": "waits"})  # waits on the executor
    runner.admit("job", "generate", {"max_tokens": 1, "ignore_eos": True}, {"id": "one", "prompt_token_ids": [3, 4]})
    assert engine.has_unfinished()
    done = runner.step()
    assert [rec["id"] for _, rec, _ in done] == ["one"]
    assert not engine.has_unfinished() and runner.has_work()
    assert ex.waits == [], "the step ran: the loop must go back to its inbox at once"
    # Now only the retrieval is left and the engine has nothing: block briefly on it.
    assert runner.step() == []
    assert len(ex.waits) == 1 and ex.waits[0] > 0
    runner.drop_all()
