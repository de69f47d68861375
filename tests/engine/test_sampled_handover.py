"""A seeded sampled sequence that changes hands at any token position draws exactly what
an unmoved run draws: the same uniform at every position, from the same distribution.

Every way a sequence changes hands inside a worker's runtime is driven here at every
position of a short generation (0, 1, either side of a 16-token block boundary, the last):
export with its KV and import elsewhere (a migration that ships KV), the same without
KV (re-prefill), a checkpoint resumed by another runtime (kill -9), and preemption with
and without host offload. The draws are compared value for value, not only the tokens.
"""

from __future__ import annotations

import pytest

from shoal.nodes.worker.engine import EngineConfig, LLMEngine
from shoal.nodes.worker.program_runner import ProgramRunner
from shoal.output_compare import DRAW_RULE, compare_results
from shoal.protocol.sequence_state import SequenceState
from shoal.sampling import SamplingParams

MAX_TOKENS = 24
PARAMS = SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True, return_margins=True,
                        temperature=0.8, top_p=0.9, top_k=200, seed=11)
PROMPT = [7, 300, 41, 12, 9, 250, 3, 88, 19, 402, 5]  # 11 tokens: the first block fills at token 5
POSITIONS = range(MAX_TOKENS)


def make_engine(model, **kw) -> LLMEngine:
    return LLMEngine(model, EngineConfig(policy="mb", kv_cache_bytes=1 << 22, **kw))


@pytest.fixture(scope="module")
def reference(tiny_model):
    return make_engine(tiny_model).generate([PROMPT], PARAMS, seq_ids=["s"])[0]


def until(engine: LLMEngine, sid, tokens: int) -> None:
    while len(engine.seqs[sid].output_token_ids) < tokens:
        assert not engine.step(), "the sequence finished before the move"


def finish(engine: LLMEngine) -> dict:
    out = {}
    while engine.has_unfinished():
        out.update({o.seq_id: o for o in engine.step()})
    return out


def assert_same_draws(got, ref) -> None:
    """got: a RequestOutput or a program's record (a dict)."""
    draws = got["draws"] if isinstance(got, dict) else got.draws
    assert len(draws) == len(ref.draws) == MAX_TOKENS
    assert [d[0] for d in draws] == [d[0] for d in ref.draws], "a position drew another uniform"
    cmp = compare_results(got, ref)
    assert cmp.rule == DRAW_RULE
    assert cmp and cmp.diverged_at is None, cmp.detail


@pytest.mark.parametrize("with_kv", [True, False], ids=["kv-shipped", "re-prefill"])
def test_export_and_import_at_every_position(tiny_model, reference, with_kv):
    for k in POSITIONS:
        src = make_engine(tiny_model)
        # Another sequence in the batch, so the moved one runs in other batch shapes too.
        src.add_request("other", prompt_token_ids=[1, 2, 3], params=PARAMS)
        src.add_request("s", prompt_token_ids=PROMPT, params=PARAMS)
        until(src, "s", k)
        state = src.export_sequence("s", remove=True)
        state = SequenceState.from_header(state.header(), bytes(state.kv) if with_kv and state.kv else None)
        if not with_kv:
            state.num_computed = 0
        dst = make_engine(tiny_model)
        dst.import_sequence(state)
        got = finish(dst)["s"]
        assert_same_draws(got, reference)
        assert got.token_ids[:k] == reference.token_ids[:k]


@pytest.mark.parametrize("how", ["checkpoint", "moved-without-kv", "moved-with-kv"])
def test_runtime_handover_at_every_position(tiny_model, reference, how):
    """The worker's own path (ProgramRunner): the last checkpoint (tokens and draws so
    far, no KV: what a worker's death leaves), or a migration's export with or without
    its KV, admitted by another worker's runtime."""
    item = {"id": "s", "prompt_token_ids": PROMPT}
    for k in POSITIONS:
        if how == "checkpoint" and k == 0:
            continue  # a checkpoint holds at least one token of the operation
        runner = ProgramRunner(make_engine(tiny_model), checkpoint_tokens=max(k, 1))
        runner.admit("job", "generate", PARAMS.to_dict(), item)
        runner.admit("job", "generate", PARAMS.to_dict(), {"id": "other", "prompt_token_ids": [1, 2, 3]})
        while len(runner.engine.seqs[("job", "s")].output_token_ids) < k:
            assert not runner.step(), "a sequence finished before the hand-over"
        kv = None
        if how == "checkpoint":
            state = [e["state"] for _, e in runner.checkpoints if e["id"] == "s"][-1]
        else:
            state, kv = runner.export(("job", "s"), with_kv=how == "moved-with-kv")
            assert (kv is not None) == (how == "moved-with-kv" and k > 0)
        assert len(state["generated"]["output_token_ids"]) == len(state["generated"]["draws"]) == k
        other = ProgramRunner(make_engine(tiny_model))
        assert other.admit("job", "generate", PARAMS.to_dict(), item, state, kv) == []
        done = []
        while other.has_work():
            done += other.step()
        (_, rec, _), = done
        assert_same_draws(rec, reference)
        assert rec["token_ids"][:k] == reference.token_ids[:k]


@pytest.mark.parametrize("offload", [True, False], ids=["offload-restore", "recompute"])
def test_preempted_at_every_position(tiny_model, reference, offload):
    for k in POSITIONS:
        eng = make_engine(tiny_model, offload_bytes=(1 << 24) if offload else 0)
        eng.add_request("s", prompt_token_ids=PROMPT, params=PARAMS)
        until(eng, "s", k)
        seq = eng.seqs["s"]
        if seq in eng.running:
            eng._preempt(seq)
            assert (seq.host_kv is not None) == (offload and seq.num_tokens > 0)
        got = finish(eng)["s"]
        assert_same_draws(got, reference)
