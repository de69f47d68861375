"""Decoder model configuration read from a Hugging Face `config.json`.

Only the fields Shoal's decoder uses are kept; everything else in the file is ignored.
Every problem a user can hit with a model folder (no config, unknown architecture,
unsupported RoPE scaling) raises `ModelError` with a message that names it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from shoal.protocol.errors import ShoalError


class ModelError(ShoalError, ValueError):
    """A model folder that Shoal cannot load; the message says why."""


# Architecture name in config.json -> model family. They share one decoder: RMSNorm,
# RoPE, grouped-query attention, SwiGLU; Qwen2 adds q/k/v biases, Qwen3 per-head q/k
# RMSNorm; Qwen3-MoE, Qwen2-MoE and Mixtral replace the MLP of their sparse layers by
# routed experts (Qwen2-MoE adds a shared expert behind a sigmoid gate; Mixtral is
# Llama attention with every layer sparse and its top-k weights always renormalized).
SUPPORTED_ARCHITECTURES = {
    "Qwen3ForCausalLM": "qwen3",
    "Qwen3MoeForCausalLM": "qwen3_moe",
    "Qwen2MoeForCausalLM": "qwen2_moe",
    "MixtralForCausalLM": "mixtral",
    "Qwen2ForCausalLM": "qwen2",
    "LlamaForCausalLM": "llama",
}
MOE_FAMILIES = ("qwen3_moe", "qwen2_moe", "mixtral")


@dataclass(frozen=True)
class DecoderConfig:
    architecture: str
    family: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool
    qk_norm: bool
    eos_token_ids: tuple[int, ...]
    torch_dtype: str
    # Mixture of experts (0 experts: a dense model). A layer is sparse when its index is
    # not in mlp_only_layers and (index + 1) is a multiple of decoder_sparse_step.
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    norm_topk_prob: bool = False
    decoder_sparse_step: int = 1
    mlp_only_layers: tuple[int, ...] = ()
    shared_expert_intermediate_size: int = 0  # Qwen2-MoE's shared expert (0: none)

    def is_moe_layer(self, i: int) -> bool:
        return self.num_experts > 0 and i not in self.mlp_only_layers and (i + 1) % self.decoder_sparse_step == 0

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    def shape_dict(self) -> dict:
        """The fields that fix tensor shapes: part of the model fingerprint."""
        return {
            "architecture": self.architecture,
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_layers": self.num_layers,
            "num_heads": self.num_heads,
            "num_kv_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            **({"num_experts": self.num_experts, "num_experts_per_tok": self.num_experts_per_tok,
                "moe_intermediate_size": self.moe_intermediate_size, "norm_topk_prob": self.norm_topk_prob,
                "shared_expert_intermediate_size": self.shared_expert_intermediate_size,
                "sparse_layers": [i for i in range(self.num_layers) if self.is_moe_layer(i)]}
               if self.num_experts else {}),
        }


def load_decoder_config(model_dir: str | Path) -> DecoderConfig:
    path = Path(model_dir) / "config.json"
    if not Path(model_dir).is_dir():
        raise ModelError(f"model folder {model_dir} does not exist")
    if not path.is_file():
        raise ModelError(f"model folder {model_dir} has no config.json")
    try:
        raw = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ModelError(f"{path} is not valid JSON: {e}") from None
    return decoder_config_from_dict(raw, source=str(path))


def decoder_config_from_dict(raw: dict, source: str = "config") -> DecoderConfig:
    archs = raw.get("architectures") or []
    arch = next((a for a in archs if a in SUPPORTED_ARCHITECTURES), None)
    if arch is None:
        raise ModelError(
            f"{source}: unsupported architecture {archs or raw.get('model_type')!r}; "
            f"Shoal's decoder runs {sorted(SUPPORTED_ARCHITECTURES)}"
        )
    family = SUPPORTED_ARCHITECTURES[arch]

    def need(key: str):
        if key not in raw:
            raise ModelError(f"{source}: missing field {key!r}")
        return raw[key]

    # transformers 5 writes RoPE's settings as rope_parameters (rope_theta and any scaling
    # inside); earlier releases wrote rope_scaling. A scaling Shoal does not apply is refused,
    # never ignored: the model would run, with every position's rotation wrong.
    for key in ("rope_scaling", "rope_parameters"):
        rope = raw.get(key)
        if rope and rope.get("rope_type", rope.get("type")) not in (None, "default"):
            raise ModelError(f"{source}: unsupported {key} {rope!r} (Shoal applies RoPE without scaling)")
    windowed = [t for t in raw.get("layer_types") or () if t != "full_attention"]
    if raw.get("use_sliding_window") or windowed:
        raise ModelError(f"{source}: sliding-window attention is not supported "
                         f"({'use_sliding_window' if raw.get('use_sliding_window') else 'layer_types: ' + windowed[0]})")
    hidden = int(need("hidden_size"))
    heads = int(need("num_attention_heads"))
    eos = raw.get("eos_token_id")
    eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (int(eos),))
    default_bias = family in ("qwen2", "qwen2_moe")
    return DecoderConfig(
        architecture=arch,
        family=family,
        vocab_size=int(need("vocab_size")),
        hidden_size=hidden,
        intermediate_size=int(need("intermediate_size")),
        num_layers=int(need("num_hidden_layers")),
        num_heads=heads,
        num_kv_heads=int(raw.get("num_key_value_heads") or heads),
        head_dim=int(raw.get("head_dim") or hidden // heads),
        rms_norm_eps=float(raw.get("rms_norm_eps", 1e-5 if family == "mixtral" else 1e-6)),  # transformers' defaults
        rope_theta=float(raw.get("rope_theta", (raw.get("rope_parameters") or {}).get("rope_theta", 10000.0))),
        max_position_embeddings=int(raw.get("max_position_embeddings", 2048)),
        tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
        attention_bias=bool(raw.get("attention_bias", raw.get("qkv_bias", default_bias))),
        qk_norm=family in ("qwen3", "qwen3_moe"),
        eos_token_ids=eos_ids,
        torch_dtype=str(raw.get("torch_dtype") or raw.get("dtype") or "float32"),
        **(_moe_fields(raw, source, need, family) if family in MOE_FAMILIES else {}),
    )


def _moe_fields(raw: dict, source: str, need, family: str) -> dict:
    # Mixtral names the same fields its own way, and has every layer sparse and its
    # top-k weights always renormalized.
    mixtral = family == "mixtral"
    # The experts' count under either name transformers takes for it (its attribute_map):
    # Qwen3-MoE configs say num_experts up to transformers 4.x and num_local_experts from 5.
    count_key = next((k for k in ("num_experts", "num_local_experts") if k in raw), "num_experts")
    width_key = "intermediate_size" if mixtral else "moe_intermediate_size"
    if mixtral:
        window = raw.get("sliding_window")
        if window is not None and int(window) < int(raw.get("max_position_embeddings", 2048)):
            raise ModelError(f"{source}: sliding-window attention ({window} tokens) is not supported")
    experts, top_k = int(need(count_key)), int(need("num_experts_per_tok"))
    if not 1 <= top_k <= experts:
        raise ModelError(f"{source}: num_experts_per_tok {top_k} must be between 1 and {count_key} {experts}")
    fields = {"num_experts": experts, "num_experts_per_tok": top_k, "moe_intermediate_size": int(need(width_key))}
    if mixtral:
        return {**fields, "norm_topk_prob": True}
    step = int(raw.get("decoder_sparse_step", 1))
    if step < 1:
        raise ModelError(f"{source}: decoder_sparse_step must be at least 1, got {step}")
    return {**fields, "norm_topk_prob": bool(raw.get("norm_topk_prob", False)), "decoder_sparse_step": step,
            "mlp_only_layers": tuple(int(i) for i in raw.get("mlp_only_layers") or ()),
            "shared_expert_intermediate_size": int(raw.get("shared_expert_intermediate_size") or 0)}
