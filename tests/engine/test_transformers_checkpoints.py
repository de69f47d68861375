"""Checkpoints as the installed transformers writes them, not only as `shoal make-model`
does: its configs rename fields between releases (5.x writes a Qwen3-MoE's expert count
as `num_local_experts` and RoPE's settings as `rope_parameters`), and Shoal reads every
name transformers itself takes for a field, refusing by name what it would compute
wrong (a RoPE scaling, sliding-window attention)."""

from __future__ import annotations

import json
import shutil

import pytest

from shoal.nodes.worker.models.config import SUPPORTED_ARCHITECTURES, ModelError, decoder_config_from_dict

pytestmark = pytest.mark.timeout(300)

SHAPE = dict(vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2)


def written_config(arch: str, tmp_path, **fields) -> dict:
    import transformers

    cls = getattr(transformers, arch.replace("ForCausalLM", "Config"))
    cls(**SHAPE, **fields).save_pretrained(tmp_path)
    raw = json.loads((tmp_path / "config.json").read_text())
    raw.setdefault("architectures", [arch])
    return raw


@pytest.mark.parametrize("arch", sorted(SUPPORTED_ARCHITECTURES))
def test_every_architecture_s_config_as_transformers_writes_it_loads(arch, tmp_path):
    raw = written_config(arch, tmp_path, **({"num_experts_per_tok": 2} if "Mo" in arch or "Mixtral" in arch else {}))
    cfg = decoder_config_from_dict(raw)
    assert (cfg.hidden_size, cfg.num_layers, cfg.num_kv_heads) == (32, 2, 2)
    if cfg.family in ("qwen3_moe", "qwen2_moe", "mixtral"):
        named = raw.get("num_local_experts", raw.get("num_experts"))
        assert cfg.num_experts == named > 0 and cfg.num_experts_per_tok == 2


def test_a_rope_scaling_in_rope_parameters_is_refused_by_name(tmp_path):
    raw = written_config("LlamaForCausalLM", tmp_path, rope_scaling={"rope_type": "linear", "factor": 2.0})
    assert raw["rope_parameters"]["rope_type"] == "linear"  # where transformers 5 puts it
    with pytest.raises(ModelError, match="rope_parameters"):
        decoder_config_from_dict(raw)


def test_sliding_window_attention_is_refused_by_name(tmp_path):
    raw = written_config("Qwen3ForCausalLM", tmp_path, use_sliding_window=True, sliding_window=16)
    with pytest.raises(ModelError, match="sliding-window"):
        decoder_config_from_dict(raw)


def test_a_qwen3_moe_saved_by_transformers_generates_as_transformers_does(tiny_moe_model, tmp_path):
    """The tiny Qwen3-MoE loaded by transformers and saved again by it (its config names,
    its safetensors): Shoal's logits and greedy tokens equal transformers' on that folder."""
    from transformers import AutoModelForCausalLM

    from shoal.nodes.worker.engine import EngineConfig, LLMEngine
    from test_reference import MIXED, check_against_hf, random_prompts

    saved = tmp_path / "saved"
    AutoModelForCausalLM.from_pretrained(tiny_moe_model, dtype="float32").save_pretrained(saved)
    for f in tiny_moe_model.iterdir():  # the tokenizer's files
        if f.name.startswith("tokenizer") or f.name.endswith(".jinja"):
            shutil.copy(f, saved / f.name)
    raw = json.loads((saved / "config.json").read_text())
    assert "num_local_experts" in raw and "num_experts" not in raw, "transformers now writes the old name: update this test"
    eng = LLMEngine(saved, EngineConfig(max_num_batched_tokens=96))
    assert eng.model_cfg.num_experts == 8
    check_against_hf(saved, eng, random_prompts(4, 512, MIXED, seed=8), max_tokens=12, greedy_refs=1)
