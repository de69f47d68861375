"""Async scheduling (`pending_tokens.py`): each step is launched before the last one's
tokens are read, its rows taking their input tokens from the device. On the CPU the
overlap gains nothing, but the code is the GPU's, so here it must give the outputs of
steps taken in order: under stop tokens and stop strings that end sequences a step
early (their extra row is dropped), preemption with and without host offload, shared
prefixes, min_tokens, sampled rows, logprobs, margins and draws,
and a sequence exported while its last token is in flight."""

from __future__ import annotations

import dataclasses
import random

import torch

from shoal.nodes.worker.engine import EngineConfig, LLMEngine
from shoal.output_compare import compare_results
from shoal.sampling import SamplingParams


def engine(model, overlap: bool, **kw) -> LLMEngine:
    return LLMEngine(model, EngineConfig(device="cpu", async_scheduling=overlap, max_num_batched_tokens=256, **kw))


def workload(seed: int = 0, n: int = 40):
    r = random.Random(seed)
    shared = [r.randrange(10, 500) for _ in range(40)]  # a prefix several prompts share
    prompts = [(shared if i % 4 == 0 else []) + [r.randrange(10, 500) for _ in range(r.randint(1, 90))] for i in range(n)]
    params = [SamplingParams(max_tokens=r.randint(1, 40), temperature=0.0 if i % 2 else 0.9, top_p=0.9, seed=5,
                             ignore_eos=True, min_tokens=3 if i % 5 == 0 else 0, return_margins=True)
              for i in range(n)]
    return prompts, params


def with_early_stops(model, prompts, params):
    """Each sequence also stops at a token (or, for some, a text) it generates midway in
    a first run: stops the host learns of only when it reads the token."""
    first = engine(model, False).generate(prompts, params)
    out = []
    for i, (p, o) in enumerate(zip(params, first)):
        k = len(o.token_ids) // 2
        if i % 3 == 0 and k:
            p = dataclasses.replace(p, stop_token_ids=(o.token_ids[k],))
        elif i % 3 == 1 and len(o.text) > 6:
            p = dataclasses.replace(p, stop=(o.text[len(o.text) // 2: len(o.text) // 2 + 2],))
        out.append(p)
    return out


def assert_same(ref, got):
    for i, (a, b) in enumerate(zip(ref, got)):
        cmp = compare_results(a, b)  # the reference's margins and draws judge a parting
        assert cmp, f"sequence {i}: {cmp.detail}"
        assert a.finish_reason == b.finish_reason or cmp.diverged is not None, f"sequence {i}"


def without_margins(params):
    return [dataclasses.replace(p, return_margins=False) for p in params]


def test_async_steps_give_the_outputs_of_steps_in_order(tiny_model):
    prompts, params = workload()
    params = with_early_stops(tiny_model, prompts, params)
    ref = engine(tiny_model, False).generate(prompts, params)
    eng = engine(tiny_model, True)
    got = eng.generate(prompts, params)
    assert_same(ref, got)
    assert all(len(o.margins) == len(o.token_ids) for o in got)  # a dropped token's figures dropped with it
    assert sum(o.finish_reason == "stop" for o in ref) >= 10  # the early stops happened
    assert eng.stats.steps_ahead >= 20, eng.stats  # and most steps went ahead
    assert eng.stats.generated_tokens == sum(len(o.token_ids) for o in got)  # dropped rows are not counted
    assert eng.blocks.num_used == 0 and eng._in_flight is None


def test_async_steps_under_preemption_and_offload(tiny_model):
    """A KV cache of 32 blocks for 40 sequences: sequences whose token is in flight are
    preempted, offloaded to host memory, brought back and re-prefilled."""
    prompts, params = workload(seed=1)
    for offload in (0, 1 << 22):
        kw = dict(kv_cache_bytes=32 * 16 * 2 * 2 * 2 * 16 * 4, offload_bytes=offload)
        ref = engine(tiny_model, False, **kw).generate(prompts, params)
        eng = engine(tiny_model, True, **kw)
        preempted_in_flight = []
        preempt = eng._preempt
        eng._preempt = lambda seq: (preempted_in_flight.append(seq.pending), preempt(seq))
        got = eng.generate(prompts, params)
        assert_same(ref, got)
        assert all(len(o.margins) == len(o.token_ids) for o in got)
        assert eng.stats.preemptions >= 3 and eng.stats.steps_ahead >= 10, eng.stats
        assert any(preempted_in_flight), "no sequence was preempted with its token in flight"
        assert (eng.stats.offloads > 0) == bool(offload)
        assert eng.blocks.num_used == 0


def test_rows_reading_figures_back_go_ahead_and_record_what_steps_in_order_record(tiny_model):
    """Logprobs, margins and draws are computed on the device with the draw and come back
    with their tokens, so rows asking for them go ahead (a penalized one after the read)
    and record exactly what steps in order record (nothing stops early here, so both run
    the same batches)."""
    prompts, params = workload(seed=2, n=24)
    # (margins asked by half the sampled rows and half the greedy ones: draws and margins part)
    params = [dataclasses.replace(p, logprobs=i % 3 * 2, max_tokens=min(p.max_tokens, 24), return_margins=i % 4 < 2)
              for i, p in enumerate(params)]
    params[8] = dataclasses.replace(params[8], repetition_penalty=1.3, max_tokens=12)
    ref = engine(tiny_model, False).generate(prompts, params)
    eng = engine(tiny_model, True)
    got = eng.generate(prompts, params)
    assert [o.token_ids for o in got] == [o.token_ids for o in ref]
    assert [o.logprobs for o in got] == [o.logprobs for o in ref]
    assert [(o.margins, o.draws) for o in got] == [(o.margins, o.draws) for o in ref]
    assert all(len(o.logprobs) == len(o.token_ids) for o in got)
    assert {len(o.logprobs[0]["top_logprobs"]) for o in got} == {0, 2, 4}
    asked = [p.return_margins for p in params]
    assert all(len(o.margins) == len(o.token_ids) for o, a in zip(got, asked) if a)
    assert not any(o.margins or o.draws for o, a in zip(got, asked) if not a)
    assert sum(len(o.draws) for o in got) > 20  # sampled rows' draws came back too
    assert eng.stats.steps_ahead >= eng.stats.steps // 2, eng.stats


def test_a_sequence_exported_with_its_token_in_flight_resumes_elsewhere(tiny_model):
    prompts, params = workload(seed=3, n=8)
    params = [dataclasses.replace(p, max_tokens=24, min_tokens=0) for p in params]
    ref = engine(tiny_model, False).generate(prompts, params)
    eng = engine(tiny_model, True)
    for i, (prompt, p) in enumerate(zip(prompts, params)):
        eng.add_request(i, prompt_token_ids=prompt, params=p)
    done = {}
    while not (eng._in_flight is not None and 5 in eng.seqs and eng.seqs[5] in eng._in_flight.row
               and len(eng.seqs[5].output_token_ids) >= 6):
        assert 5 in eng.seqs, "sequence 5 finished before it was caught in flight"
        done.update((o.seq_id, o) for o in eng.step())
    seq = eng.seqs[5]
    assert seq.pending == 1 and seq.num_tokens == seq.num_known_tokens + 1
    state = eng.export_sequence(5, remove=True)
    assert state.output_token_ids == seq.output_token_ids and len(state.output_token_ids) >= 6
    while eng.has_unfinished():
        done.update((o.seq_id, o) for o in eng.step())
    assert 5 not in done  # its token in flight was dropped with it
    other = engine(tiny_model, False)
    other.import_sequence(state)
    while other.has_unfinished():
        done.update((o.seq_id, o) for o in other.step())
    assert_same(ref, [done[i] for i in range(8)])


def test_a_step_with_tokens_in_flight_takes_no_host_tensor(tiny_model):
    """The rows continuing a sequence the last step sampled read its token on the device:
    the indices ride the step's one staged copy, and no op mixes host and device."""
    from test_ops_backends import RejectMixedDevices

    from shoal.nodes.worker.kv_cache import KVCache
    from shoal.nodes.worker.model_runner import ModelRunner
    from shoal.nodes.worker.models.loader import load_decoder
    from shoal.nodes.worker.ops_backend import TorchOps
    from shoal.nodes.worker.pending_tokens import PendingTokens
    from shoal.nodes.worker.sequence import Sequence

    model, _ = load_decoder(tiny_model, "float32", device="meta")
    runner = ModelRunner(model, KVCache(model.cfg, 64, 16, torch.float32, device="meta"), TorchOps())
    seqs = []
    for i, known in enumerate([20, 9, 33]):
        seq = Sequence(i, list(range(known)), SamplingParams())
        seq.block_table, seq.num_computed = list(range(3 * i, 3 * i + 3)), known
        seqs.append(seq)
    prefill = Sequence(9, list(range(30)), SamplingParams())
    prefill.block_table = [50, 51]
    in_flight = PendingTokens([seqs[2], seqs[0]], torch.empty(2, dtype=torch.long, device="meta"))
    assert [s.pending for s in seqs] == [1, 0, 1] and seqs[0].token(20) == 0
    chunks = [(seqs[0], 1), (prefill, 30), (seqs[2], 1)]
    mode = RejectMixedDevices("meta")
    with mode:
        logits, rows = runner.run(chunks, [True, True, True], carry=in_flight)
    assert logits.device.type == "meta" and rows == [0, 2, 1]
    assert not mode.offenders, f"ops given host tensors beside device ones: {sorted(set(mode.offenders))}"
    assert mode.transfers == 1, f"the step's inputs went over in {mode.transfers} copies, not one"


def test_sequences_ending_by_length_run_no_extra_row(tiny_model):
    """Without stops, every sequence ends at its max_tokens: known while its last token is
    in flight, so async steps plan exactly the rows of steps in order."""
    prompts, params = workload(seed=4, n=32)
    params = [dataclasses.replace(p, return_margins=False) for p in params]
    sync, overlapped = engine(tiny_model, False), engine(tiny_model, True)
    ref, got = sync.generate(prompts, params), overlapped.generate(prompts, params)
    assert [o.token_ids for o in got] == [o.token_ids for o in ref]
    assert overlapped.stats.rows_stepped == sync.stats.rows_stepped
    assert overlapped.stats.steps == sync.stats.steps and overlapped.stats.steps_ahead >= sync.stats.steps // 2


def test_a_step_failing_before_it_reads_the_tokens_in_flight_loses_none(tiny_model):
    """A step that raises before it reads the last step's tokens (the worker logs it and
    steps again) loses none of them: the sequences compute again and draw them again."""
    prompts, params = workload(seed=5, n=16)
    params = without_margins(params)
    ref = engine(tiny_model, False).generate(prompts, params)
    eng = engine(tiny_model, True)
    for i, (prompt, p) in enumerate(zip(prompts, params)):
        eng.add_request(i, prompt_token_ids=prompt, params=p)
    run, calls, failed = eng.runner.run, [0], []

    def failing_every_fifth(chunks, mask, carry=None):
        calls[0] += 1
        if calls[0] % 5 == 0 and carry is not None:
            failed.append(calls[0])
            raise RuntimeError("injected")
        return run(chunks, mask, carry)

    eng.runner.run = failing_every_fifth
    done = {}
    while eng.has_unfinished():
        try:
            done.update((o.seq_id, o) for o in eng.step())
        except RuntimeError as e:
            assert str(e) == "injected"
    assert len(failed) >= 3
    assert [done[i].token_ids for i in range(16)] == [o.token_ids for o in ref]


def test_grammars_and_penalties_sample_after_the_read_and_go_ahead(tiny_model):
    """Rows whose sampling needs the last token on the host (a grammar's mask, penalties)
    read it after the next step's model is queued, then sample without reading back:
    the outputs of steps in order, and every output of a grammar that ended is in its
    language."""
    import re

    prompts, params = workload(seed=6, n=24)
    params = without_margins(params)
    for i in range(0, 24, 4):
        params[i] = dataclasses.replace(params[i], regex="[a-z]{3,12}( [a-z]{2,8}){0,3}", max_tokens=40,
                                        ignore_eos=False)
    for i in range(1, 24, 6):
        params[i] = dataclasses.replace(params[i], repetition_penalty=1.4, frequency_penalty=0.5)
    ref = engine(tiny_model, False).generate(prompts, params)
    eng = engine(tiny_model, True)
    got = eng.generate(prompts, params)
    assert [o.token_ids for o in got] == [o.token_ids for o in ref]
    assert eng.stats.steps_ahead >= eng.stats.steps // 2, eng.stats
    ended = [got[i] for i in range(0, 24, 4) if got[i].finish_reason == "stop"]
    assert ended and all(re.fullmatch("[a-z]{3,12}( [a-z]{2,8}){0,3}", o.text) for o in ended), \
        [o.text for o in ended]
