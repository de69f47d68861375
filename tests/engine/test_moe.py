"""Qwen3-MoE, Qwen2-MoE and Mixtral: logits and greedy tokens equal transformers' on the same
folder (fp32), and the expert-batched MLP equals running each sequence's tokens alone."""

from __future__ import annotations

import random

import pytest
import torch

from shoal.nodes.worker.engine import EngineConfig, LLMEngine
from test_reference import MIXED, check_against_hf, random_prompts


def test_moe_matches_transformers(tiny_moe_model):
    eng = LLMEngine(tiny_moe_model, EngineConfig(max_num_batched_tokens=96))
    cfg = eng.model_cfg
    assert cfg.num_experts == 8 and cfg.num_experts_per_tok == 2 and all(cfg.is_moe_layer(i) for i in range(2))
    check_against_hf(tiny_moe_model, eng, random_prompts(8, 512, MIXED, seed=4), max_tokens=16, greedy_refs=2)


def test_expert_batches_do_not_change_a_token_s_output(tiny_moe_model):
    """One MLP call over many sequences' tokens, grouped by expert, gives each token
    what a call over its own sequence gives (fp32 rounding aside)."""
    from shoal.nodes.worker.models.loader import load_decoder

    model, _ = load_decoder(tiny_moe_model, "float32")
    moe = model.layers[0].mlp
    r = random.Random(0)
    seqs = [torch.randn(r.randint(1, 9), 64, generator=torch.Generator().manual_seed(i)) for i in range(40)]
    with torch.inference_mode():
        together = moe(torch.cat(seqs))
        alone = torch.cat([moe(s) for s in seqs])
        batches = moe.expert_batches(torch.cat(seqs))
    torch.testing.assert_close(together, alone, atol=1e-5, rtol=1e-5)
    assert sum(batches) == 2 * sum(len(s) for s in seqs) and sum(b > 0 for b in batches) == 8


def test_qwen2_moe_with_its_shared_expert_matches_transformers(tmp_path):
    from shoal.nodes.worker.models.make_model import make_model

    folder = make_model(tmp_path / "q2moe", preset="moe-tiny", architecture="Qwen2MoeForCausalLM", dtype="float32",
                        tokenizer_text_chars=40_000)
    eng = LLMEngine(folder, EngineConfig(max_num_batched_tokens=96))
    assert eng.model_cfg.shared_expert_intermediate_size == 128 and eng.model_cfg.attention_bias
    check_against_hf(folder, eng, random_prompts(6, 512, MIXED, seed=5), max_tokens=12, greedy_refs=1)


def test_mixtral_matches_transformers(tmp_path):
    """Mixtral's names (block_sparse_moe, experts' w1/w3/w2, num_local_experts) over
    Llama attention, every layer sparse, top-k always renormalized."""
    from shoal.nodes.worker.models.make_model import make_model

    folder = make_model(tmp_path / "mixtral", preset="moe-tiny", architecture="MixtralForCausalLM", dtype="float32",
                        tokenizer_text_chars=40_000)
    eng = LLMEngine(folder, EngineConfig(max_num_batched_tokens=96))
    cfg = eng.model_cfg
    assert cfg.family == "mixtral" and cfg.num_experts == 8 and cfg.moe_intermediate_size == 64
    assert cfg.norm_topk_prob and not cfg.qk_norm and not cfg.attention_bias
    check_against_hf(folder, eng, random_prompts(6, 512, MIXED, seed=6), max_tokens=12, greedy_refs=1)


def test_a_sliding_window_mixtral_is_refused_by_name():
    import pytest

    from shoal.nodes.worker.models.config import ModelError, decoder_config_from_dict
    from shoal.nodes.worker.models.make_model import preset_config

    raw = preset_config("moe-tiny", "MixtralForCausalLM", "float32")
    raw["sliding_window"] = 256
    with pytest.raises(ModelError, match="sliding-window attention"):
        decoder_config_from_dict(raw)


def test_grouped_experts_equal_the_loop_and_read_nothing_back(tiny_moe_model, monkeypatch):
    """The experts in two grouped GEMMs (`torch._grouped_mm`, where torch has it) give
    what one multiply per chosen expert gives, without reading any value back to the
    host: on a GPU that read is a synchronization per layer."""
    from shoal.nodes.worker.models.loader import load_decoder

    model, _ = load_decoder(tiny_moe_model, "float32")
    moe = model.layers[0].mlp
    x = torch.randn(37, 64, generator=torch.Generator().manual_seed(3))
    with torch.inference_mode():
        moe.grouped = False
        loop = moe(x)
        moe.grouped = None
        with monkeypatch.context() as m:
            for name in ("tolist", "item"):
                m.setattr(torch.Tensor, name, lambda *a, _n=name: pytest.fail(f"the grouped path called .{_n}()"))
            grouped = moe(x)
    assert moe.grouped == hasattr(torch, "_grouped_mm"), "torch has a grouped GEMM, but the block did not use it"
    torch.testing.assert_close(grouped, loop, atol=1e-5, rtol=1e-5)
