"""Steps computed at a padded row count (`EngineConfig.pad_rows`, on by default where
the CPU has AMX): the linears see only the listed sizes, and what a sequence generates
does not change. The logits against transformers with padding on are checked in
test_reference.py."""

from __future__ import annotations

import random

import pytest

from shoal.nodes.worker.engine import EngineConfig, LLMEngine
from shoal.nodes.worker.models.packed_linear import PackedLinear
from shoal.nodes.worker.models.row_buckets import padded_rows
from shoal.output_compare import compare_results
from shoal.sampling import SamplingParams

pytestmark = pytest.mark.timeout(300)


def prompts(n=24, seed=0):
    r = random.Random(seed)
    return [[r.randrange(511) for _ in range(r.randint(1, 90))] for _ in range(n)]


def rows_seen(engine) -> set[int]:
    seen: set[int] = set()
    for m in engine.model.modules():
        if isinstance(m, PackedLinear):
            m.register_forward_pre_hook(lambda mod, args: seen.add(args[0].shape[0]))
    return seen


@pytest.mark.parametrize("pad_rows", [True, False])
def test_padded_steps_reach_the_linears_at_listed_sizes_only(tiny_model, pad_rows):
    eng = LLMEngine(tiny_model, EngineConfig(max_num_batched_tokens=200, pad_rows=pad_rows))
    assert eng.packed_linears > 0 and eng.runner.ops is not None
    seen = rows_seen(eng)
    outs = eng.generate(prompts(), SamplingParams(max_tokens=12, ignore_eos=True))
    assert all(len(o.token_ids) == 12 for o in outs)
    unlisted = {r for r in seen if padded_rows(r) != r}
    if pad_rows:
        assert not unlisted, f"linears ran at unpadded row counts {sorted(unlisted)}"
    else:  # the same job unpadded does run at such counts: the check above can fail
        assert unlisted


def test_bf16_outputs_are_the_same_padded_or_not(tiny_model):
    params = SamplingParams(max_tokens=16, ignore_eos=True, return_margins=True)
    runs = [LLMEngine(tiny_model, EngineConfig(dtype="bfloat16", max_num_batched_tokens=200, pad_rows=pad))
            .generate(prompts(), params) for pad in (False, True)]
    for i, (plain, padded) in enumerate(zip(*runs)):
        cmp = compare_results(plain, padded)
        assert cmp, f"prompt {i}: {cmp.detail}"
