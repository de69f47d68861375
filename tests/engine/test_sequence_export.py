"""A sequence exported mid-generation and imported into another engine continues as if
it had never moved; state from another model is refused."""

from __future__ import annotations

import random

import pytest

from shoal.nodes.worker.engine import EngineConfig, LLMEngine
from shoal.output_compare import compare_outputs
from shoal.protocol.sequence_state import SequenceState, StateError
from shoal.sampling import SamplingParams


def prompts(n, seed=0):
    r = random.Random(seed)
    return [[r.randrange(511) for _ in range(r.randint(5, 120))] for _ in range(n)]


def run_until(engine, steps):
    for _ in range(steps):
        engine.step()


@pytest.mark.parametrize("params", [
    SamplingParams(max_tokens=40, ignore_eos=True, return_margins=True),
    SamplingParams(max_tokens=40, ignore_eos=True, return_margins=True, temperature=0.9, top_p=0.95, seed=3),
])
def test_export_import_continues_identically(tiny_model, params):
    ps = prompts(8)
    reference = LLMEngine(tiny_model, EngineConfig()).generate(ps, params)

    src = LLMEngine(tiny_model, EngineConfig(max_num_batched_tokens=64))
    for i, p in enumerate(ps):
        src.add_request(i, prompt_token_ids=p, params=params)
    run_until(src, 12)  # some sequences mid-decode, some mid-prefill
    moved = [3, 6]
    states = [src.export_sequence(i, remove=True) for i in moved]
    assert any(s.kv is not None and len(s.output_token_ids) > 0 for s in states)
    # Through plain data and bytes, as the wire will carry it.
    states = [SequenceState.from_header(s.header(), bytes(s.kv) if s.kv else None) for s in states]

    dst = LLMEngine(tiny_model, EngineConfig())
    for s in states:
        dst.import_sequence(s)
    results = {}
    for eng in (src, dst):
        while eng.has_unfinished():
            results.update({o.seq_id: o for o in eng.step()})
    assert sorted(results) == list(range(8))
    for i in range(8):
        cmp = compare_outputs(results[i].token_ids, reference[i].token_ids, [reference[i].margins])
        assert cmp, f"sequence {i}: {cmp.detail}"
    # The imported KV was used, not recomputed: dst prefilled nothing of the moved prompts.
    assert dst.stats.prompt_tokens_computed == 0


def test_a_sequence_exported_from_the_host_pool_continues_identically(tiny_model):
    """Preempted sequences' KV in the host pool (`host_kv_pool.py`): one is exported from
    there and imported elsewhere, another restored by a copy; both finish as if never
    moved, and the pool's spans are all given back."""
    params = SamplingParams(max_tokens=30, ignore_eos=True, return_margins=True)
    ps = prompts(4, seed=2)
    reference = LLMEngine(tiny_model, EngineConfig()).generate(ps, params)
    src = LLMEngine(tiny_model, EngineConfig(max_num_batched_tokens=64, offload_bytes=1 << 22))
    for i, p in enumerate(ps):
        src.add_request(i, prompt_token_ids=p, params=params)
    run_until(src, 8)
    for i in (1, 2):
        src._preempt(src.seqs[i])
    assert src.seqs[1].host_kv is not None and src.offloaded_bytes > 0
    state = src.export_sequence(1, remove=True)
    assert state.kv is not None and state.num_computed > 0
    dst = LLMEngine(tiny_model, EngineConfig())
    dst.import_sequence(SequenceState.from_header(state.header(), bytes(state.kv)))
    results = {}
    for eng in (src, dst):
        while eng.has_unfinished():
            results.update({o.seq_id: o for o in eng.step()})
    assert src.stats.restores >= 1 and src.offloaded_bytes == 0 and src.host_pool.spans.free == [(0, src.host_pool.spans.size)]
    for i in range(4):
        cmp = compare_outputs(results[i].token_ids, reference[i].token_ids, [reference[i].margins])
        assert cmp, f"sequence {i}: {cmp.detail}"


def test_state_from_another_model_is_refused(tiny_model, tiny_model_other_seed):
    src = LLMEngine(tiny_model, EngineConfig())
    src.add_request("x", prompt_token_ids=[1, 2, 3, 4], params=SamplingParams(max_tokens=10))
    run_until(src, 3)
    state = src.export_sequence("x")
    other = LLMEngine(tiny_model_other_seed, EngineConfig())
    assert other.fingerprint != src.fingerprint
    with pytest.raises(StateError, match="'x'.*from model"):
        other.import_sequence(state)
    # A forged header does not get a foreign KV blob in either.
    state.model_fingerprint = other.fingerprint
    with pytest.raises(StateError, match="KV blob is from model"):
        other.import_sequence(state)
    assert not other.has_unfinished()


def test_truncated_kv_blob_is_refused(tiny_model):
    src = LLMEngine(tiny_model, EngineConfig())
    src.add_request("y", prompt_token_ids=list(range(1, 40)), params=SamplingParams(max_tokens=10))
    run_until(src, 3)
    state = src.export_sequence("y")
    state.kv = state.kv[: len(state.kv) // 2]
    dst = LLMEngine(tiny_model, EngineConfig())
    with pytest.raises(StateError, match="truncated"):
        dst.import_sequence(state)


def exported_midway(tiny_model):
    """A run's output undisturbed, and its sequence "z" exported after 6 steps."""
    params = SamplingParams(max_tokens=20, ignore_eos=True, return_margins=True)
    p = list(range(1, 60))
    ref = LLMEngine(tiny_model, EngineConfig()).generate([p], params, seq_ids=["z"])[0]
    src = LLMEngine(tiny_model, EngineConfig())
    src.add_request("z", prompt_token_ids=p, params=params)
    run_until(src, 6)
    return ref, src.export_sequence("z")


def test_import_without_room_reprefills(tiny_model):
    ref, state = exported_midway(tiny_model)
    dst = LLMEngine(tiny_model, EngineConfig(num_blocks=5, block_size=16))
    dst.add_request("hog", prompt_token_ids=list(range(1, 60)), params=SamplingParams(max_tokens=4, ignore_eos=True))
    dst.step()  # "hog" now holds 4 of the 5 blocks
    dst.import_sequence(state)
    out = {}
    while dst.has_unfinished():
        out.update({o.seq_id: o for o in dst.step()})
    cmp = compare_outputs(out["z"].token_ids, ref.token_ids, [ref.margins])
    assert cmp, cmp.detail


def test_import_past_a_step_cap_waits_its_turn_and_reprefills(tiny_model):
    """After failed steps capped the engine (`step_failures.py`), an imported sequence
    does not join the running ones beyond the cap: it waits, and continues the same."""
    ref, state = exported_midway(tiny_model)
    dst = LLMEngine(tiny_model, EngineConfig())
    dst.step_cap = 1
    dst.add_request("first", prompt_token_ids=list(range(3, 40)), params=SamplingParams(max_tokens=4, ignore_eos=True))
    dst.step()
    dst.import_sequence(state)
    assert [s.seq_id for s in dst.running] == ["first"] and dst.seqs["z"].num_computed == 0
    out, most = {}, 0
    while dst.has_unfinished():
        out.update({o.seq_id: o for o in dst.step()})
        most = max(most, len(dst.running))
    assert most == 1
    cmp = compare_outputs(out["z"].token_ids, ref.token_ids, [ref.margins])
    assert cmp, cmp.detail


def test_import_of_fully_computed_state_recomputes_the_last_token(tiny_model):
    params = SamplingParams(max_tokens=12, ignore_eos=True, return_margins=True)
    p = list(range(1, 30))
    ref = LLMEngine(tiny_model, EngineConfig()).generate([p], params, seq_ids=["f"])[0]
    src = LLMEngine(tiny_model, EngineConfig())
    src.add_request("f", prompt_token_ids=p, params=params)
    run_until(src, 4)
    state = src.export_sequence("f")
    assert state.num_computed == len(p) + len(state.output_token_ids) - 1
    # A sender that (wrongly) claims KV for every token, the last included.
    extra = LLMEngine(tiny_model, EngineConfig())
    extra.add_request("f", prompt_token_ids=p + state.output_token_ids, params=SamplingParams(max_tokens=5))
    extra.step()  # prefills every token of p + outputs, samples one more
    full = extra.export_sequence("f")
    state.kv, state.num_computed = full.kv, full.num_computed
    assert state.num_computed == len(p) + len(state.output_token_ids)
    dst = LLMEngine(tiny_model, EngineConfig())
    dst.import_sequence(state)
    out = {}
    while dst.has_unfinished():
        out.update({o.seq_id: o for o in dst.step()})
    cmp = compare_outputs(out["f"].token_ids, ref.token_ids, [ref.margins])
    assert cmp, cmp.detail


def test_import_with_tokens_outside_the_vocabulary_is_refused(tiny_model):
    src = LLMEngine(tiny_model, EngineConfig())
    src.add_request("v", prompt_token_ids=[1, 2, 3], params=SamplingParams(max_tokens=5))
    run_until(src, 2)
    state = src.export_sequence("v")
    state.output_token_ids = state.output_token_ids + [10**6]
    with pytest.raises(Exception, match="outside the vocabulary"):
        LLMEngine(tiny_model, EngineConfig()).import_sequence(state)


def test_kv_moves_between_caches_of_either_dtype(tiny_model):
    """fp32 engines whose caches differ in dtype (a bf16 cache under `auto` on one CPU, an
    fp32 one elsewhere or asked for) move sequences both ways: the KV blob carries the
    source cache's dtype, the destination stores it in its own, nothing is prefilled
    again, and the outputs are the bf16 cache's within bf16 rounding."""
    from shoal.output_compare import BF16_TOL

    params = SamplingParams(max_tokens=24, ignore_eos=True, return_margins=True)
    ps = prompts(4, seed=2)
    reference = LLMEngine(tiny_model, EngineConfig(dtype="float32", kv_cache_dtype="bfloat16")).generate(ps, params)
    for src_kv, dst_kv in (("bfloat16", "float32"), ("float32", "bfloat16")):
        src = LLMEngine(tiny_model, EngineConfig(dtype="float32", kv_cache_dtype=src_kv, max_num_batched_tokens=64))
        dst = LLMEngine(tiny_model, EngineConfig(dtype="float32", kv_cache_dtype=dst_kv))
        for i, p in enumerate(ps):
            src.add_request(i, prompt_token_ids=p, params=params)
        run_until(src, 10)  # every prompt prefilled (at most 480 tokens), all mid-decode
        states = [src.export_sequence(i, remove=True) for i in range(4)]
        assert all(s.kv is not None and s.output_token_ids for s in states)
        for s in states:
            dst.import_sequence(SequenceState.from_header(s.header(), bytes(s.kv) if s.kv else None))
        results = {}
        while dst.has_unfinished():
            results.update({o.seq_id: o for o in dst.step()})
        assert dst.cache.layers[0].dtype != src.cache.layers[0].dtype
        assert dst.stats.prompt_tokens_computed == 0, "imported KV was recomputed"
        for i in range(4):
            cmp = compare_outputs(results[i].token_ids, reference[i].token_ids, [reference[i].margins], tol=BF16_TOL)
            assert cmp, f"{src_kv} -> {dst_kv}, sequence {i}: {cmp.detail}"
