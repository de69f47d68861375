"""Qwen3-MoE: logits and greedy tokens equal transformers' on the same folder (fp32),
and the expert-batched MLP equals running each sequence's tokens alone."""

from __future__ import annotations

import random

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
