"""Weight streaming (`--device-memory`): layers that do not fit stay in host memory and
are copied in ahead of use; the tokens are those of the fully resident model, and a
mixture-of-experts layer copies only the experts its router chose."""

from __future__ import annotations

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
    # Decode steps of 6 sequences choose at most 12 of each layer's 8 experts; single
    # sequences' steps far fewer: some experts were never copied.
    assert st["experts_skipped"] > 0 and st["experts_fetched"] > 0
    one = streamed.streamer.summary()["bytes_fetched"]
    streamed.generate(prompts[:1], SamplingParams(max_tokens=8, ignore_eos=True))
    per_token_one = (streamed.streamer.summary()["bytes_fetched"] - one) / 8
    assert per_token_one < s.weight_bytes  # never more than the whole model per step


def test_a_budget_too_small_is_refused_by_name(six_layer_moe):
    with pytest.raises(ValueError, match="cannot hold the embeddings and output projection"):
        LLMEngine(six_layer_moe, EngineConfig(policy="mb", device_memory=1000))
