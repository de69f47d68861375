"""Load a decoder's weights straight from a Hugging Face folder's safetensors files.

Every expected tensor is checked by name and shape before anything is copied, so a bad
checkpoint fails with the tensor's name instead of a shape error deep inside torch.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch
from safetensors import safe_open

from shoal.nodes.worker.models.config import DecoderConfig, ModelError, load_decoder_config
from shoal.nodes.worker.models.decoder import DecoderLM

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def parse_dtype(name: str | torch.dtype) -> torch.dtype:
    if isinstance(name, torch.dtype):
        return name
    if name not in DTYPES:
        raise ModelError(f"unsupported dtype {name!r}; choose one of {sorted(DTYPES)}")
    return DTYPES[name]


def expert_names(cfg: DecoderConfig, prefix: str) -> dict[str, str]:
    """A sparse layer's router and per-expert tensors as the checkpoint names them
    (`{}`: the expert's index): Mixtral's `block_sparse_moe.experts.N.w1/w3/w2`, the
    Qwen MoEs' `mlp.experts.N.gate_proj/up_proj/down_proj`."""
    if cfg.family == "mixtral":
        m = prefix + "block_sparse_moe."
        return {"router": m + "gate.weight", "gate": m + "experts.{}.w1.weight", "up": m + "experts.{}.w3.weight",
                "down": m + "experts.{}.w2.weight"}
    m = prefix + "mlp."
    return {"router": m + "gate.weight", "gate": m + "experts.{}.gate_proj.weight",
            "up": m + "experts.{}.up_proj.weight", "down": m + "experts.{}.down_proj.weight"}


def expected_shapes(cfg: DecoderConfig) -> dict[str, tuple[int, ...]]:
    h, d = cfg.hidden_size, cfg.head_dim
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (cfg.vocab_size, h), "model.norm.weight": (h,)}
    if not cfg.tie_word_embeddings:
        shapes["lm_head.weight"] = (cfg.vocab_size, h)
    for i in range(cfg.num_layers):
        p = f"model.layers.{i}."
        shapes[p + "input_layernorm.weight"] = (h,)
        shapes[p + "post_attention_layernorm.weight"] = (h,)
        shapes[p + "self_attn.q_proj.weight"] = (cfg.q_size, h)
        shapes[p + "self_attn.k_proj.weight"] = (cfg.kv_size, h)
        shapes[p + "self_attn.v_proj.weight"] = (cfg.kv_size, h)
        shapes[p + "self_attn.o_proj.weight"] = (h, cfg.q_size)
        if cfg.attention_bias:
            shapes[p + "self_attn.q_proj.bias"] = (cfg.q_size,)
            shapes[p + "self_attn.k_proj.bias"] = (cfg.kv_size,)
            shapes[p + "self_attn.v_proj.bias"] = (cfg.kv_size,)
        if cfg.qk_norm:
            shapes[p + "self_attn.q_norm.weight"] = (d,)
            shapes[p + "self_attn.k_norm.weight"] = (d,)
        if cfg.is_moe_layer(i):
            names = expert_names(cfg, p)
            shapes[names["router"]] = (cfg.num_experts, h)
            for e in range(cfg.num_experts):
                shapes[names["gate"].format(e)] = (cfg.moe_intermediate_size, h)
                shapes[names["up"].format(e)] = (cfg.moe_intermediate_size, h)
                shapes[names["down"].format(e)] = (h, cfg.moe_intermediate_size)
            if cfg.shared_expert_intermediate_size:
                s = cfg.shared_expert_intermediate_size
                shapes[p + "mlp.shared_expert.gate_proj.weight"] = (s, h)
                shapes[p + "mlp.shared_expert.up_proj.weight"] = (s, h)
                shapes[p + "mlp.shared_expert.down_proj.weight"] = (h, s)
                shapes[p + "mlp.shared_expert_gate.weight"] = (1, h)
            continue
        shapes[p + "mlp.gate_proj.weight"] = (cfg.intermediate_size, h)
        shapes[p + "mlp.up_proj.weight"] = (cfg.intermediate_size, h)
        shapes[p + "mlp.down_proj.weight"] = (h, cfg.intermediate_size)
    return shapes


def read_checkpoint(model_dir: Path, cfg: DecoderConfig) -> dict[str, torch.Tensor]:
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise ModelError(f"model folder {model_dir} has no *.safetensors file")
    tensors: dict[str, torch.Tensor] = {}
    wanted = expected_shapes(cfg)
    for f in files:
        try:
            with safe_open(str(f), framework="pt") as fh:
                for name in fh.keys():
                    if name in wanted:
                        tensors[name] = fh.get_tensor(name)
        except Exception as e:  # safetensors raises its own error types for corrupt files
            raise ModelError(f"cannot read {f}: {e}") from None
    missing = [n for n in wanted if n not in tensors]
    if missing:
        raise ModelError(f"{model_dir}: missing tensor {missing[0]}" + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""))
    for name, shape in wanted.items():
        if tuple(tensors[name].shape) != shape:
            raise ModelError(f"{model_dir}: tensor {name} has shape {tuple(tensors[name].shape)}, expected {shape}")
    return tensors


def weights_fingerprint(cfg: DecoderConfig, tensors: dict[str, torch.Tensor]) -> str:
    """Architecture, shapes and a hash of the weights. Large tensors are hashed on a
    strided sample of at most 256K elements so that fingerprinting a multi-GB model
    stays cheap; any real re-training or different seed changes every sample."""
    h = hashlib.sha256(json.dumps(cfg.shape_dict(), sort_keys=True).encode())
    for name in sorted(tensors):
        t = tensors[name].reshape(-1)
        stride = max(1, t.numel() // 262144)
        sample = t[::stride].contiguous()
        h.update(name.encode())
        h.update(str(tuple(tensors[name].shape)).encode())
        h.update(sample.view(torch.uint8).numpy().tobytes() if sample.dtype != torch.bfloat16 else sample.view(torch.int16).numpy().tobytes())
    return f"{cfg.architecture}:{h.hexdigest()[:32]}"


def load_decoder(model_dir: str | Path, dtype: str | torch.dtype = "float32") -> tuple[DecoderLM, str]:
    """Returns the model (eval mode, in `dtype`) and its fingerprint."""
    model_dir = Path(model_dir)
    cfg = load_decoder_config(model_dir)
    tdtype = parse_dtype(dtype)
    tensors = read_checkpoint(model_dir, cfg)
    fingerprint = weights_fingerprint(cfg, tensors)
    with torch.device("meta"):
        model = DecoderLM(cfg)
    model = model.to_empty(device="cpu").to(tdtype)
    state = {"embed.weight": tensors["model.embed_tokens.weight"], "norm.weight": tensors["model.norm.weight"]}
    if not cfg.tie_word_embeddings:
        state["lm_head.weight"] = tensors["lm_head.weight"]
    for i in range(cfg.num_layers):
        p, q = f"model.layers.{i}.", f"layers.{i}."
        state[q + "input_norm.weight"] = tensors[p + "input_layernorm.weight"]
        state[q + "post_attn_norm.weight"] = tensors[p + "post_attention_layernorm.weight"]
        state[q + "attn.qkv.weight"] = torch.cat([tensors[p + f"self_attn.{n}_proj.weight"] for n in "qkv"])
        if cfg.attention_bias:
            state[q + "attn.qkv.bias"] = torch.cat([tensors[p + f"self_attn.{n}_proj.bias"] for n in "qkv"])
        state[q + "attn.o.weight"] = tensors[p + "self_attn.o_proj.weight"]
        if cfg.qk_norm:
            state[q + "attn.q_norm.weight"] = tensors[p + "self_attn.q_norm.weight"]
            state[q + "attn.k_norm.weight"] = tensors[p + "self_attn.k_norm.weight"]
        if cfg.is_moe_layer(i):  # experts stacked: one tensor each for gate+up and down (`moe.py`)
            names, experts = expert_names(cfg, p), range(cfg.num_experts)
            state[q + "mlp.router.weight"] = tensors[names["router"]]
            state[q + "mlp.gate_up"] = torch.stack([torch.cat([tensors[names["gate"].format(j)],
                                                               tensors[names["up"].format(j)]]) for j in experts])
            state[q + "mlp.down"] = torch.stack([tensors[names["down"].format(j)] for j in experts])
            if cfg.shared_expert_intermediate_size:
                s = p + "mlp.shared_expert."
                state[q + "mlp.shared.gate_up.weight"] = torch.cat([tensors[s + "gate_proj.weight"], tensors[s + "up_proj.weight"]])
                state[q + "mlp.shared.down.weight"] = tensors[s + "down_proj.weight"]
                state[q + "mlp.shared_gate.weight"] = tensors[p + "mlp.shared_expert_gate.weight"]
            continue
        state[q + "mlp.gate_up.weight"] = torch.cat([tensors[p + "mlp.gate_proj.weight"], tensors[p + "mlp.up_proj.weight"]])
        state[q + "mlp.down.weight"] = tensors[p + "mlp.down_proj.weight"]
    with torch.no_grad():
        params = dict(model.named_parameters())
        for name, value in state.items():
            params[name].copy_(value)
    if cfg.tie_word_embeddings:
        model.lm_head.weight = model.embed.weight
    model.eval()
    return model, fingerprint
