"""Write a random-weight decoder checkpoint in exactly the Hugging Face layout.

`config.json`, `model.safetensors` and `tokenizer.json`, so that both Shoal and
`transformers` load the same folder. The weights are drawn from a seeded generator.
The init is chosen for useful greedy tests, measured on both presets: projections at
1/sqrt(fan_in) so every layer moves the residual stream; small embeddings (std 0.05) so
the tied output projection does not just copy the current token forever; and a final
norm scaled by 4 so logits spread over several units (median top-two gap ~0.5-1,
far above fp32 rounding), not near-uniform as at the usual std 0.02.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
from safetensors.torch import save_file

from shoal.nodes.worker.models.config import ModelError
from shoal.nodes.worker.models.loader import expected_shapes, parse_dtype
from shoal.nodes.worker.models.config import decoder_config_from_dict
from shoal.nodes.worker.models.presets import PRESETS, TOKENIZER_TEXT_CHARS
from shoal.nodes.worker.tokenizer_builder import EOS_TOKEN, build_tokenizer


def preset_config(preset: str, architecture: str = "Qwen3ForCausalLM", dtype: str = "bfloat16",
                  overrides: dict | None = None) -> dict:
    if preset not in PRESETS:
        raise ModelError(f"unknown preset {preset!r}; choose one of {sorted(PRESETS)}")
    if architecture not in ("Qwen3ForCausalLM", "Qwen2ForCausalLM", "LlamaForCausalLM"):
        raise ModelError(f"unsupported architecture {architecture!r}")
    shape = {**PRESETS[preset], **(overrides or {})}
    model_type = {"Qwen3ForCausalLM": "qwen3", "Qwen2ForCausalLM": "qwen2", "LlamaForCausalLM": "llama"}[architecture]
    cfg = {
        "architectures": [architecture],
        "model_type": model_type,
        **shape,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0},
        "tie_word_embeddings": True,
        "hidden_act": "silu",
        "attention_bias": architecture == "Qwen2ForCausalLM",
        "bos_token_id": None,
        "eos_token_id": shape["vocab_size"] - 1,
        "torch_dtype": dtype,
        "use_cache": True,
    }
    if architecture == "Qwen2ForCausalLM":
        cfg["use_sliding_window"] = False
    return cfg


def random_weights(raw_cfg: dict, seed: int, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    cfg = decoder_config_from_dict(raw_cfg)
    gen = torch.Generator().manual_seed(seed)
    out = {}
    for name, shape in expected_shapes(cfg).items():
        if name == "model.norm.weight":
            t = 4.0 * (1.0 + 0.1 * torch.randn(shape, generator=gen))
        elif name.endswith("norm.weight"):
            t = 1.0 + 0.1 * torch.randn(shape, generator=gen)
        elif name.endswith(".bias"):
            t = 0.1 * torch.randn(shape, generator=gen)
        elif "embed_tokens" in name or name == "lm_head.weight":
            t = 0.05 * torch.randn(shape, generator=gen)
        else:
            t = torch.randn(shape, generator=gen) / math.sqrt(shape[1])
        out[name] = t.to(dtype).contiguous()
    return out


def make_model(out_dir: str | Path, preset: str = "tiny", architecture: str = "Qwen3ForCausalLM",
               dtype: str = "bfloat16", seed: int = 0, overrides: dict | None = None,
               tokenizer_text_chars: int | None = None, tokenizer: str | Path | None = None) -> Path:
    """`overrides` changes preset fields (tests use a 2-layer model of the small shape).
    `tokenizer`: a folder whose tokenizer.json the model takes (its vocabulary size
    becomes the model's) instead of one trained on stdlib text."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if tokenizer is not None:
        from tokenizers import Tokenizer

        src = Path(tokenizer) / "tokenizer.json"
        if not src.is_file():
            raise ModelError(f"tokenizer folder {tokenizer} has no tokenizer.json")
        tok = Tokenizer.from_file(str(src))
        tok.no_truncation()  # an encoder's 128-token limit is not the decoder's
        tok.no_padding()
        overrides = {**(overrides or {}), "vocab_size": tok.get_vocab_size()}
    raw = preset_config(preset, architecture, dtype, overrides)
    eos = EOS_TOKEN
    if tokenizer is None:
        tok = build_tokenizer(raw["vocab_size"], tokenizer_text_chars or TOKENIZER_TEXT_CHARS[preset])
    else:  # the end-of-sequence token a tokenizer of that family has (BERT's [SEP]), else its last id
        eos = next((t for t in (EOS_TOKEN, "</s>", "[SEP]") if tok.token_to_id(t) is not None), tok.id_to_token(raw["vocab_size"] - 1))
        raw["eos_token_id"] = tok.token_to_id(eos)
    tok.save(str(out / "tokenizer.json"))
    weights = random_weights(raw, seed, parse_dtype(dtype))
    save_file(weights, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(raw, indent=2))
    (out / "generation_config.json").write_text(json.dumps({"eos_token_id": raw["eos_token_id"]}))
    (out / "tokenizer_config.json").write_text(json.dumps({"eos_token": eos, "model_max_length": raw["max_position_embeddings"]}))
    return out
