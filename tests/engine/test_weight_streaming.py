"""Weight streaming (`--device-memory`): layers that do not fit stay in host memory and
are copied in ahead of use; the tokens are those of the fully resident model, and a
mixture-of-experts layer copies only the experts its router chose unless the step's
tokens are expected to use most of them."""

from __future__ import annotations

from dataclasses import replace

import pytest

from shoal.nodes.worker.engine import EngineConfig, LLMEngine
from shoal.nodes.worker.weight_streamer import nbytes
from shoal.output_compare import compare_outputs
from shoal.sampling import SamplingParams
from test_reference import random_prompts


@pytest.fixture(scope="module")
def six_layer_moe(tmp_path_factory):
    from shoal.nodes.worker.models.make_model import make_model

    return make_model(tmp_path_factory.mktemp("moe6"), preset="moe-tiny", dtype="float32",
                      overrides={"num_hidden_layers": 6}, tokenizer_text_chars=40_000)


@pytest.mark.parametrize("attention", ["native", "sdpa"])
def test_streamed_layers_give_the_resident_tokens(six_layer_moe, attention):
    params = SamplingParams(max_tokens=12, ignore_eos=True, return_margins=True)
    prompts = random_prompts(6, 512, [1, 9, 40], seed=7)
    resident = LLMEngine(six_layer_moe, EngineConfig(policy="mb", attention=attention))
    weights = nbytes(resident.model)
    assert resident.streamer is None
    streamed = LLMEngine(six_layer_moe, EngineConfig(policy="mb", attention=attention, device_memory=weights // 2))
    s = streamed.streamer
    assert s is not None and len(s.streamed) >= 3 and s.resident_bytes <= weights // 2
    for a, b in zip(streamed.generate(prompts, params), resident.generate(prompts, params)):
        cmp = compare_outputs(a.token_ids, b.token_ids, [a.margins, b.margins])
        assert cmp, cmp.detail
    st = streamed.stats_snapshot()["weight_streaming"]
    assert st["layers_fetched"] >= len(s.streamed) * 12 and st["bytes_fetched"] > 0
    # Decode steps of 6 sequences are expected to use 1 - (6/8)^6 = 82% of each layer's 8
    # experts (top-2): all of them came ahead of use with the layer, none after routing.
    assert st["experts_prefetched"] > 0 and st["fetch_cost"]["bandwidth"] > 0
    # One sequence's steps choose 2 of 8: only the chosen ones are copied, after routing,
    # and the tokens are still the resident model's.
    one = s.summary()
    alone = SamplingParams(max_tokens=8, ignore_eos=True, return_margins=True)
    a, b = streamed.generate(prompts[:1], alone)[0], resident.generate(prompts[:1], alone)[0]
    cmp = compare_outputs(a.token_ids, b.token_ids, [a.margins, b.margins])
    assert cmp, cmp.detail
    after = s.summary()
    assert after["experts_skipped"] > one["experts_skipped"] and after["experts_fetched"] > one["experts_fetched"]
    assert (after["bytes_fetched"] - one["bytes_fetched"]) / 8 < s.weight_bytes  # never the whole model per step


def test_a_budget_too_small_is_refused_by_name(six_layer_moe):
    with pytest.raises(ValueError, match="cannot hold the embeddings and output projection"):
        LLMEngine(six_layer_moe, EngineConfig(policy="mb", device_memory=1000))


def test_steps_grow_until_their_compute_covers_the_fetch(six_layer_moe):
    """The calibration's cost per decoding sequence and per prompt token against the
    fetch term: where a step of the configured size computes for less time than its
    weights take to copy, the engine takes more sequences and tokens per step (a
    budget the user set stays)."""
    from shoal.nodes.worker.engine_config import DEFAULT_BUDGET
    from shoal.scheduler.cost_model import CostModel

    weights = nbytes(LLMEngine(six_layer_moe, EngineConfig(policy="mb", num_blocks=4)).model)
    config = EngineConfig(policy="mb", device_memory=weights // 2, max_num_seqs=8)
    cheap = CostModel(alpha_p=1e-3, beta_p=1e-7, alpha_d=1e-3, beta_d=1e-7, mb_a=0, mb_b=0, mb_c=0)
    eng = LLMEngine(six_layer_moe, config, cost_model=cheap)
    fetch = eng.streamer.fetch_cost
    seqs, tokens = eng.config.max_num_seqs, eng.config.max_num_batched_tokens
    assert seqs > 8 and tokens > DEFAULT_BUDGET and tokens >= seqs and "cover it" in eng.fetch_sizing
    capped = seqs == min(eng.blocks.num_blocks, 8192)
    assert capped or (cheap.beta_d * seqs >= fetch.fetch_time(seqs) > cheap.beta_d * (seqs - 1))
    assert eng.stats_snapshot()["weight_streaming"]["sizing"] == eng.fetch_sizing
    eng = LLMEngine(six_layer_moe, replace(config, max_num_batched_tokens=64), cost_model=cheap)
    assert eng.config.max_num_seqs > 8 and eng.config.max_num_batched_tokens == 64
    # Compute that already covers the copies at the configured size changes nothing.
    dear = CostModel(alpha_p=1e-3, beta_p=10.0, alpha_d=1e-3, beta_d=10.0, mb_a=0, mb_b=0, mb_c=0)
    eng = LLMEngine(six_layer_moe, config, cost_model=dear)
    assert (eng.config.max_num_seqs, eng.config.max_num_batched_tokens) == (8, DEFAULT_BUDGET)
    # A calibration whose costs are not positive, or none, sizes nothing, and says why.
    broken = CostModel(alpha_p=1e-3, beta_p=0.0, alpha_d=1e-3, beta_d=0.0, mb_a=0, mb_b=0, mb_c=0)
    eng = LLMEngine(six_layer_moe, config, cost_model=broken)
    assert eng.config.max_num_seqs == 8 and "not positive" in eng.fetch_sizing
    eng = LLMEngine(six_layer_moe, config)
    assert eng.config.max_num_seqs == 8 and "no device calibration" in eng.fetch_sizing


def test_a_failed_step_leaves_no_stale_copy(six_layer_moe):
    """A step that fails part way leaves the next layer's copy pending, and that slot is
    overwritten by the next step's first layer: the streamer drops the stale copy and
    fetches the layer again, so the next steps still give the resident model's tokens."""
    params = SamplingParams(max_tokens=6, ignore_eos=True, return_margins=True)
    prompts = random_prompts(3, 512, [5, 9], seed=3)
    resident = LLMEngine(six_layer_moe, EngineConfig(policy="mb"))
    weights = nbytes(resident.model)
    streamed = LLMEngine(six_layer_moe, EngineConfig(policy="mb", device_memory=weights // 2))
    s = streamed.streamer
    assert len(s.streamed) >= 3
    layer = streamed.model.layers[s.streamed[1]]
    real = layer.forward_native

    def fail_once(*args, **kwargs):
        layer.forward_native = real
        raise RuntimeError("injected")

    layer.forward_native = fail_once
    for i, p in enumerate(prompts):
        streamed.add_request(i, prompt_token_ids=p, params=params)
    with pytest.raises(RuntimeError, match="injected"):
        streamed.step()
    assert any(k != s.streamed[0] for k in s._pending)  # the failed step's copy of a later layer
    streamed.abort(0), streamed.abort(1), streamed.abort(2)
    for a, b in zip(streamed.generate(prompts, params), resident.generate(prompts, params)):
        cmp = compare_outputs(a.token_ids, b.token_ids, [a.margins, b.margins])
        assert cmp, cmp.detail
