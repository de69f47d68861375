"""The engine against Hugging Face transformers on the same folder (fp32).

Logits of every sampling step agree within 1e-4; greedy tokens are the same output as
`generate` by the shared comparator; for mixed prompt lengths in one batch, with chunked
prefill on and off, with prefix sharing, and across preemption.
"""

from __future__ import annotations

import random

import pytest
import torch

from hf_reference import hf_greedy, hf_step_logits
from shoal.nodes.worker.engine import EngineConfig, LLMEngine
from shoal.output_compare import compare_outputs
from shoal.sampling import SamplingParams

LOGIT_ATOL = 1e-4


def random_prompts(n, vocab, lengths, seed=0):
    r = random.Random(seed)
    return [[r.randrange(vocab - 1) for _ in range(r.choice(lengths))] for _ in range(n)]


def run_and_capture(engine, prompts, max_tokens):
    """Runs greedily; returns outputs and each sequence's per-step logits."""
    steps: dict = {i: [] for i in range(len(prompts))}

    def hook(ids, logits):
        for sid, row in zip(ids, logits):
            steps[sid].append(row.clone())

    engine.on_logits = hook
    outs = engine.generate(prompts, SamplingParams(max_tokens=max_tokens, ignore_eos=True, return_margins=True))
    return outs, {k: torch.stack(v) for k, v in steps.items()}


def assert_not_degenerate(outs):
    distinct = [len(set(o.token_ids)) for o in outs]
    assert sum(d > 1 for d in distinct) >= len(outs) // 2, f"outputs are one token repeated: {distinct}"
    assert len({t for o in outs for t in o.token_ids}) > 10


def check_against_hf(model_dir, engine, prompts, max_tokens, greedy_refs=2):
    outs, logits = run_and_capture(engine, prompts, max_tokens)
    assert_not_degenerate(outs)
    for i, (p, o) in enumerate(zip(prompts, outs)):
        ref = hf_step_logits(model_dir, p, o.token_ids)
        diff = (ref - logits[i]).abs().max().item()
        assert diff < LOGIT_ATOL, f"sequence {i} (prompt {len(p)} tokens): logits differ by {diff}"
    # Token-for-token against generate() itself, for a few prompts (it is slow).
    for i in range(min(greedy_refs, len(prompts))):
        ref_tokens = hf_greedy(model_dir, prompts[i], max_tokens)
        cmp = compare_outputs(outs[i].token_ids, ref_tokens, [outs[i].margins])
        assert cmp, f"sequence {i}: {cmp.detail}"
    return outs


MIXED = [1, 2, 7, 16, 17, 33, 64, 100, 255, 300]


@pytest.mark.parametrize("chunked, attention, pad_rows", [(True, "native", False), (False, "native", False),
                                                       (True, "sdpa", False), (True, "native", True),
                                                       (False, "native", True)])
def test_tiny_matches_transformers(tiny_model, chunked, attention, pad_rows):
    """`pad_rows`: every step computed at a padded row count (`models/row_buckets.py`;
    the default only where that is free, on AMX), which must not change a logit."""
    eng = LLMEngine(tiny_model, EngineConfig(max_num_batched_tokens=64 if chunked else 512,
                                             chunked_prefill=chunked, attention=attention, pad_rows=pad_rows))
    if attention == "native":
        assert eng.runner.ops is not None, "the native kernel did not build"
    assert eng.packed_linears > 0, "the projections were not packed for oneDNN"
    prompts = random_prompts(10, 512, MIXED)
    check_against_hf(tiny_model, eng, prompts, max_tokens=24)
    assert eng.stats.steps > 0 and not eng.has_unfinished()


@pytest.mark.parametrize("chunked", [True, False])
def test_prefill_chunks_through_sdpa_beside_the_kernel_match_transformers(tiny_model, chunked, monkeypatch):
    """The native forward with every prefill chunk sent through gather + SDPA (on request:
    `sdpa_prefill_work`), decodes still in the kernel: fresh prompts,
    chunks after a cached prefix (two flash calls each), and steps holding both kinds."""
    from shoal.nodes.worker import attention

    split = []
    real = attention.attend_after_prefix

    def counting(*a):
        split.append(1)
        return real(*a)
    monkeypatch.setattr(attention, "attend_after_prefix", counting)
    eng = LLMEngine(tiny_model, EngineConfig(max_num_batched_tokens=64 if chunked else 512,
                                             chunked_prefill=chunked, sdpa_prefill_work=1))
    assert eng.runner.ops is not None and eng.runner.sdpa_prefill_work == 1
    check_against_hf(tiny_model, eng, random_prompts(10, 512, MIXED, seed=5), max_tokens=16)
    if chunked:
        assert split, "no chunk after a cached prefix ran as two flash calls"


def test_every_prefill_chunk_stays_in_the_kernel_by_default(tiny_model, monkeypatch):
    """The default native path runs no chunk through gather + SDPA, however large (the
    tiles lead SDPA on every chunk shape measured, model_runner.py)."""
    from shoal.nodes.worker.models import decoder

    calls = []
    real = decoder.prefill_sdpa
    monkeypatch.setattr(decoder, "prefill_sdpa", lambda *a: calls.append(1) or real(*a))
    eng = LLMEngine(tiny_model, EngineConfig(max_num_batched_tokens=2048))
    assert eng.runner.ops is not None and eng.runner.sdpa_prefill_work == 0
    eng.generate(random_prompts(2, 512, [1500], seed=7), SamplingParams(max_tokens=2, ignore_eos=True))
    assert eng.stats.prompt_tokens_computed == 3000 and not calls


def test_mlp_in_pieces_matches_transformers(tiny_model, monkeypatch):
    """Steps whose MLP rows outgrow what malloc keeps (step_buffers.py) run the MLP in
    pieces of rows: the same logits. The limit is shrunk so a tiny model's steps split."""
    from shoal.nodes.worker import step_buffers
    from shoal.nodes.worker.models import decoder

    eng = LLMEngine(tiny_model, EngineConfig(max_num_batched_tokens=256))
    row_bytes = eng.model.layers[0].mlp.gate_up.out_features * 4  # fp32
    monkeypatch.setattr(step_buffers, "LARGEST_STEP_TENSOR", 24 * row_bytes)
    split = []

    def recording(rows, nbytes):
        piece = step_buffers.chunk_rows(rows, nbytes)
        split.append(piece < rows)
        return piece
    monkeypatch.setattr(decoder, "chunk_rows", recording)
    check_against_hf(tiny_model, eng, random_prompts(6, 512, MIXED, seed=4), max_tokens=12, greedy_refs=1)
    assert any(split) and not all(split), "no step was split (or every step was)"


def test_other_families_match_transformers(tiny_model_family):
    eng = LLMEngine(tiny_model_family, EngineConfig(max_num_batched_tokens=96))
    check_against_hf(tiny_model_family, eng, random_prompts(6, 512, MIXED, seed=1), max_tokens=16, greedy_refs=1)


def test_small_shaped_matches_transformers(small_shaped_model):
    eng = LLMEngine(small_shaped_model, EngineConfig(max_num_batched_tokens=256))
    check_against_hf(small_shaped_model, eng, random_prompts(5, 32000, [1, 40, 130, 290], seed=2), max_tokens=12, greedy_refs=1)


def test_prefix_sharing_matches_transformers(tiny_model):
    eng = LLMEngine(tiny_model, EngineConfig(max_num_batched_tokens=128))
    r = random.Random(3)
    shared = [r.randrange(511) for _ in range(70)]
    prompts = [shared + [r.randrange(511) for _ in range(r.randint(1, 30))] for _ in range(6)]
    check_against_hf(tiny_model, eng, prompts, max_tokens=16)
    # A second wave re-sends the first prompts grown by their outputs: a growing context.
    # Sequences admitted after the first chunk of the shared prefix ran reuse its 4 blocks.
    assert eng.stats.prompt_tokens_cached >= 3 * 64, eng.stats
    before = eng.stats.prompt_tokens_computed
    grown = [p + [5, 6, 7] for p in prompts]
    check_against_hf(tiny_model, eng, grown, max_tokens=8, greedy_refs=0)
    computed = eng.stats.prompt_tokens_computed - before
    assert computed < sum(map(len, grown)) // 3, f"prefix cache saved too little: computed {computed}"


def test_preemption_matches_transformers(tiny_model):
    # 12 blocks of 16 tokens cannot hold 6 sequences of ~60 tokens: the newest are preempted.
    eng = LLMEngine(tiny_model, EngineConfig(num_blocks=12, block_size=16, max_num_batched_tokens=64))
    prompts = random_prompts(6, 512, [20, 30, 40], seed=4)
    check_against_hf(tiny_model, eng, prompts, max_tokens=24)
    assert eng.stats.preemptions > 0
    assert eng.blocks.num_used == 0  # everything was given back


@pytest.mark.parametrize("offload_bytes", [1 << 30, 40_000])  # room for all; for one (512 B a token)
def test_preempted_kv_offloaded_to_host_and_restored_matches_transformers(tiny_model, offload_bytes):
    """The same squeeze with host offloading: preempted sequences come back by a copy
    of their KV instead of a prefill, and the output is unchanged."""
    eng = LLMEngine(tiny_model, EngineConfig(num_blocks=12, block_size=16, max_num_batched_tokens=64,
                                             prefix_caching=False, offload_bytes=offload_bytes))
    prompts = random_prompts(6, 512, [20, 30, 40], seed=4)
    check_against_hf(tiny_model, eng, prompts, max_tokens=24)
    assert eng.stats.offloads > 0 and eng.stats.restores == eng.stats.offloads
    assert eng.offloaded_bytes == 0 and eng.blocks.num_used == 0
    if offload_bytes > 1 << 20:  # with room for every one, nothing was prefilled twice
        assert eng.stats.offloads == eng.stats.preemptions
        assert eng.stats.prompt_tokens_computed == sum(map(len, prompts))
