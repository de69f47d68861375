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
from shoal.nodes.worker.models.presets import MOE_ARCHITECTURE, MOE_ARCHITECTURES, PRESETS, TOKENIZER_TEXT_CHARS
from shoal.nodes.worker.tokenizer_builder import EOS_TOKEN, build_tokenizer


# The ChatML template `--chat-template chatml` writes (the format of Qwen's chat models),
# with its two special tokens; a message's content may be a string or a list of text parts.
CHATML_TOKENS = ("<|im_start|>", "<|im_end|>")
CHATML_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' }}"
    "{%- if message['content'] is string %}{{- message['content'] }}"
    "{%- else %}{%- for part in message['content'] %}{%- if part['type'] == 'text' %}{{- part['text'] }}{%- endif %}"
    "{%- endfor %}{%- endif %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
CHAT_TEMPLATES = {"chatml": (CHATML_TEMPLATE, CHATML_TOKENS)}


def preset_config(preset: str, architecture: str = "Qwen3ForCausalLM", dtype: str = "bfloat16",
                  overrides: dict | None = None) -> dict:
    if preset not in PRESETS:
        raise ModelError(f"unknown preset {preset!r}; choose one of {sorted(PRESETS)}")
    shape = {**PRESETS[preset], **(overrides or {})}
    if "num_experts" in shape and architecture not in MOE_ARCHITECTURES:  # a MoE preset is a MoE model
        architecture = MOE_ARCHITECTURE
    if architecture not in ("Qwen3ForCausalLM", "Qwen2ForCausalLM", "LlamaForCausalLM", *MOE_ARCHITECTURES):
        raise ModelError(f"unsupported architecture {architecture!r}")
    if architecture in MOE_ARCHITECTURES and "num_experts" not in shape:
        raise ModelError(f"{architecture} needs a mixture-of-experts preset (moe-tiny, moe-small)")
    if architecture == "Qwen2MoeForCausalLM":
        shape.setdefault("shared_expert_intermediate_size", 2 * shape["moe_intermediate_size"])
    model_type = {"Qwen3ForCausalLM": "qwen3", "Qwen2ForCausalLM": "qwen2", "LlamaForCausalLM": "llama",
                  MOE_ARCHITECTURE: "qwen3_moe", "Qwen2MoeForCausalLM": "qwen2_moe",
                  "MixtralForCausalLM": "mixtral"}[architecture]
    if architecture == "MixtralForCausalLM":  # Mixtral's names for the same shape
        shape["num_local_experts"] = shape.pop("num_experts")
        shape["intermediate_size"] = shape.pop("moe_intermediate_size")
        shape.pop("norm_topk_prob", None)  # always renormalized
        shape.update(sliding_window=None, router_jitter_noise=0.0)
    cfg = {
        "architectures": [architecture],
        "model_type": model_type,
        **shape,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0},
        "tie_word_embeddings": True,
        "hidden_act": "silu",
        "attention_bias": architecture in ("Qwen2ForCausalLM", "Qwen2MoeForCausalLM"),
        "bos_token_id": None,
        "eos_token_id": shape["vocab_size"] - 1,
        "torch_dtype": dtype,
        "use_cache": True,
    }
    if architecture in ("Qwen2ForCausalLM", "Qwen2MoeForCausalLM"):
        cfg["use_sliding_window"] = False
    if architecture == "Qwen2MoeForCausalLM":
        cfg["qkv_bias"] = True
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
               tokenizer_text_chars: int | None = None, tokenizer: str | Path | None = None,
               chat_template: str | None = None) -> Path:
    """`overrides` changes preset fields (tests use a 2-layer model of the small shape).
    `tokenizer`: a folder whose tokenizer.json the model takes (its vocabulary size
    becomes the model's) instead of one trained on stdlib text. `chat_template`: a name
    in CHAT_TEMPLATES; its special tokens join the vocabulary and its end-of-turn token
    ends generation."""
    if chat_template is not None and chat_template not in CHAT_TEMPLATES:
        raise ModelError(f"unknown chat template {chat_template!r}; choose one of {sorted(CHAT_TEMPLATES)}")
    template, chat_tokens = CHAT_TEMPLATES[chat_template] if chat_template else (None, ())
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
        tok.add_special_tokens(list(chat_tokens))
        overrides = {**(overrides or {}), "vocab_size": tok.get_vocab_size()}
    raw = preset_config(preset, architecture, dtype, overrides)
    eos = EOS_TOKEN
    if tokenizer is None:
        tok = build_tokenizer(raw["vocab_size"], tokenizer_text_chars or TOKENIZER_TEXT_CHARS[preset], chat_tokens)
    else:  # the end-of-sequence token a tokenizer of that family has (BERT's [SEP]), else its last id
        eos = next((t for t in (EOS_TOKEN, "</s>", "[SEP]") if tok.token_to_id(t) is not None), tok.id_to_token(raw["vocab_size"] - 1))
        raw["eos_token_id"] = tok.token_to_id(eos)
    # tokenizer_class: the folder's tokenizer.json as it is. Without it transformers 5 builds
    # the model family's own tokenizer class, whose pre-tokenizer is not this one's.
    tokenizer_config = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": eos,
                        "model_max_length": raw["max_position_embeddings"]}
    if template is not None:  # a chat ends at its end-of-turn token, text at EOS
        end_of_turn = tok.token_to_id(chat_tokens[-1])
        raw["eos_token_id"] = [end_of_turn, raw["eos_token_id"]]
        tokenizer_config.update(eos_token=chat_tokens[-1], pad_token=eos, chat_template=template)
    tok.save(str(out / "tokenizer.json"))
    weights = random_weights(raw, seed, parse_dtype(dtype))
    save_file(weights, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "generation_config.json").write_text(json.dumps({"eos_token_id": raw["eos_token_id"]}))
    (out / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2))
    # Last: a folder with a config is a whole model (scripts reuse one only then).
    (out / "config.json").write_text(json.dumps(raw, indent=2))
    return out
