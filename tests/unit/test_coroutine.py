"""Programs as resumable coroutines: run, journal, replay, and the errors they give."""

from __future__ import annotations

import random

import pytest

from shoal.coroutine import Finished, NotDeterministic, SequenceCoroutine
from shoal.program import Embed, Generate, GenerateResult, ProgramError, Retrieve, program, resolve_program
from shoal.sampling import RequestError


@program("test.two_step")
def two_step(item, max_tokens=4):
    first = yield Generate(prompt=item["q"], max_tokens=max_tokens)
    hits = yield Retrieve(query=first.text, k=2)
    second = yield Generate(prompt=item["q"] + first.text + str(hits), max_tokens=max_tokens)
    return {"first": first.text, "second": second.text}


def fake_generate(op: dict) -> GenerateResult:
    return GenerateResult(text=op["prompt"][-3:].upper(), token_ids=[1, 2], finish_reason="length")


def run(co: SequenceCoroutine, out, stop_after: int | None = None):
    """Executes operations with fakes until the program finishes (or `stop_after`)."""
    while not isinstance(out, Finished) and (stop_after is None or len(co.journal) < stop_after):
        out = co.advance(fake_generate(co.current) if co.current["op"] == "generate" else ["p1", "p2"])
    return out


def test_runs_and_journals_every_operation():
    co = SequenceCoroutine(resolve_program("test.two_step"), {"q": "abc"}, {"max_tokens": 3}, "s1")
    out = run(co, co.start())
    assert out.value == {"first": "ABC", "second": "2']"}
    assert [e["op"]["op"] for e in co.journal] == ["generate", "retrieve", "generate"]
    assert co.journal[0]["op"]["params"]["max_tokens"] == 3
    assert co.current is None


def test_replay_over_the_journal_resumes_where_it_was():
    spec = resolve_program("test.two_step")
    co = SequenceCoroutine(spec, {"q": "abc"}, {}, "s1")
    run(co, co.start(), stop_after=2)
    moved = SequenceCoroutine(spec, {"q": "abc"}, {}, "s1")
    op = moved.start(co.journal)  # no operation executed during replay
    assert isinstance(op, Generate) and moved.current == co.current and moved.op_index == 2
    assert run(moved, op).value == run(co, op).value


def test_a_non_deterministic_program_is_detected_at_replay():
    @program("test.coin")
    def coin(item):
        first = yield Generate(prompt="x", max_tokens=2)
        yield Generate(prompt=first.text + str(random.random()), max_tokens=2)
        return {}

    co = SequenceCoroutine(resolve_program("test.coin"), {}, {}, "s7")
    run(co, co.start(), stop_after=2)
    with pytest.raises(NotDeterministic, match=r"'s7'.*not deterministic.*operation 1"):
        SequenceCoroutine(resolve_program("test.coin"), {}, {}, "s7").start(co.journal)


def test_errors_name_the_sequence_and_the_problem():
    @program("test.raises")
    def raises(item):
        yield Generate(prompt="x")
        raise ValueError("bad hop")

    co = SequenceCoroutine(resolve_program("test.raises"), {}, {}, "s3")
    co.start()
    with pytest.raises(ProgramError, match=r"'s3'.*'test.raises' raised: ValueError: bad hop"):
        co.advance(GenerateResult("t", [1], "stop"))

    @program("test.yields_junk")
    def junk(item):
        yield "not an op"

    with pytest.raises(ProgramError, match="yielded str, not an operation"):
        SequenceCoroutine(resolve_program("test.yields_junk"), {}, {}, "s4").start()

    @program("test.not_generator")
    def plain(item):
        return 1

    with pytest.raises(ProgramError, match="not a generator"):
        SequenceCoroutine(resolve_program("test.not_generator"), {}, {}, "s5").start()

    with pytest.raises(ProgramError, match="could not start: TypeError"):
        SequenceCoroutine(resolve_program("test.two_step"), {}, {"nope": 1}, "s6").start()


def test_programs_resolve_by_name_or_import_path():
    assert resolve_program("generate").name == "generate"
    assert resolve_program("test_coroutine:two_step").name == "test.two_step"
    with pytest.raises(ProgramError, match="does not import: ModuleNotFoundError"):
        resolve_program("no_such_module_xyz:prog")
    with pytest.raises(ProgramError, match="has no 'missing'"):
        resolve_program("test_coroutine:missing")
    with pytest.raises(ProgramError, match="unknown program 'nope'"):
        resolve_program("nope")


def test_generate_program_and_operations_check_their_arguments():
    co = SequenceCoroutine(resolve_program("generate"), {"prompt_token_ids": [5, 6], "max_tokens": 9},
                           {"temperature": 0.5}, "g")
    op = co.start()
    assert op.prompt_token_ids == [5, 6] and op.params.max_tokens == 9 and op.params.temperature == 0.5
    assert co.advance(GenerateResult("hi", [7], "length")).value == {"text": "hi", "token_ids": [7], "finish_reason": "length"}
    with pytest.raises(RequestError, match="unknown sampling parameter"):
        Generate(prompt="x", max_token=3)
    with pytest.raises(RequestError, match="one of prompt, prompt_token_ids and messages"):
        Generate()
    with pytest.raises(RequestError, match="one of prompt, prompt_token_ids and messages"):
        Generate(prompt="x", messages=[{"role": "user", "content": "x"}])
    with pytest.raises(RequestError, match=r"messages\[1\] must be an object"):
        Generate(messages=[{"role": "user", "content": "x"}, "y"])
    chat = SequenceCoroutine(resolve_program("generate"), {"messages": [{"role": "user", "content": "hi"}]}, {}, "c")
    assert chat.start().messages == [{"role": "user", "content": "hi"}]
    with pytest.raises(RequestError, match="list of texts"):
        Embed("one string")


def test_w3_program_builds_token_prompts_from_its_tokenize_results():
    """The w3 program's first hop: its Tokenize, then a Generate of [bos] + question +
    "Thought:" ids; after a retrieval the passages' ids join the next prompt, which
    begins with the last one's prompt up to its "Thought:" ids; replay gives the same."""
    from shoal.program import Tokenize

    with pytest.raises(RequestError, match="list of texts"):
        Tokenize("one string")
    item = {"id": "q", "question": "why?", "max_hops": 1, "thought_tokens": [3], "final_tokens": 2}
    co = SequenceCoroutine(resolve_program("w3"), item, {"window": 4}, "q")
    op = co.start()
    assert co.current == {"op": "tokenize", "texts": ["why?", "\nThought:", "\nAnswer:"]}
    op = co.advance([[7, 8], [20, 21], [30, 31]])
    assert op.prompt_token_ids == [101, 7, 8, 20, 21] and op.params.max_tokens == 3 and op.params.ignore_eos
    op = co.advance(GenerateResult("a b", [5, 6, 9], "length"))
    assert op.query == "a b" and op.k == 4
    op = co.advance([{"id": "p1", "text": "x"}, {"id": "p2", "text": "y"}])
    assert op.texts == ("x", "y")
    op = co.advance([[40, 41, 42], [50, 51]])
    assert op.prompt_token_ids == [101, 7, 8, 41, 42, 50, 51, 30, 31]  # the context's last 4 tokens
    out = co.advance(GenerateResult("end", [1, 2], "length"))
    assert out.value["generated_tokens"] == 5 and out.value["retrievals"] == 1 and out.value["context_tokens"] == 5
    again = SequenceCoroutine(resolve_program("w3"), item, {"window": 4}, "q")
    assert isinstance(again.start(co.journal), Finished)
