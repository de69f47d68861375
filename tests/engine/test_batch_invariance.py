"""A sequence's output does not depend on what else is in its batch."""

from __future__ import annotations

import random

import torch

from shoal.nodes.worker.engine import EngineConfig, LLMEngine
from shoal.output_compare import compare_results
from shoal.sampling import SamplingParams

# bf16 logits of the same tokens alone and in a batch of 64 differ by the rounding of
# different matmul blockings: measured max 0.047 over 16 prompts of the tiny model (logits
# up to ~20, where one bf16 ulp is 0.125). The bound: two ulps at that magnitude.
BF16_LOGIT_ATOL = 0.25


def prompts_64(seed=0):
    r = random.Random(seed)
    return [[r.randrange(511) for _ in range(r.randint(1, 200))] for _ in range(64)]


def capture(engine):
    steps: dict = {}
    engine.on_logits = lambda ids, logits: [steps.setdefault(s, []).append(row.clone()) for s, row in zip(ids, logits)]
    return steps


def test_fp32_alone_and_in_batch_of_64_give_same_greedy_tokens(tiny_model):
    params = SamplingParams(max_tokens=32, ignore_eos=True, return_margins=True)
    prompts = prompts_64()
    batch = LLMEngine(tiny_model, EngineConfig(max_num_batched_tokens=512)).generate(prompts, params)
    for i in (0, 17, 63):
        alone = LLMEngine(tiny_model, EngineConfig()).generate([prompts[i]], params)[0]
        cmp = compare_results(alone, batch[i])
        assert cmp, f"prompt {i}: {cmp.detail}"
        assert len(alone.token_ids) == 32


def test_seeded_sampling_alone_and_in_batch(tiny_model):
    params = SamplingParams(max_tokens=24, temperature=0.8, top_p=0.9, top_k=50, seed=7, ignore_eos=True, return_margins=True)
    prompts = prompts_64(1)[:16]
    batch = LLMEngine(tiny_model, EngineConfig()).generate(prompts, params)
    alone = LLMEngine(tiny_model, EngineConfig()).generate([prompts[5]], params, seq_ids=[5])[0]
    assert alone.token_ids == batch[5].token_ids
    # Different sequences draw different numbers: sampled outputs are not all greedy.
    greedy = LLMEngine(tiny_model, EngineConfig()).generate(prompts, SamplingParams(max_tokens=24, ignore_eos=True))
    assert sum(a.token_ids != b.token_ids for a, b in zip(batch, greedy)) >= 8


def test_bf16_logits_alone_and_in_batch_agree(tiny_model):
    params = SamplingParams(max_tokens=16, ignore_eos=True, return_margins=True)
    prompts = prompts_64(2)
    eng_b = LLMEngine(tiny_model, EngineConfig(dtype="bfloat16"))
    steps_b = capture(eng_b)
    batch = eng_b.generate(prompts, params)
    for i in (3, 40):
        eng_a = LLMEngine(tiny_model, EngineConfig(dtype="bfloat16"))
        steps_a = capture(eng_a)
        alone = eng_a.generate([prompts[i]], params, seq_ids=[i])[0]
        cmp = compare_results(alone, batch[i], tol=BF16_LOGIT_ATOL)
        assert cmp, cmp.detail
        # Logits are comparable while the tokens agree (up to the first divergence).
        upto = cmp.diverged_at if cmp.diverged_at is not None else len(alone.token_ids)
        a = torch.stack(steps_a[i][: upto + 1])
        b = torch.stack(steps_b[i][: upto + 1])
        diff = (a - b).abs().max().item()
        assert diff < BF16_LOGIT_ATOL, f"prompt {i}: bf16 logits differ by {diff}"
