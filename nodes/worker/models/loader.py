"""Load a decoder's weights straight from a Hugging Face folder's safetensors files onto
the engine's device.

Every expected tensor is checked by name and shape before anything is copied, so a bad
checkpoint fails with the tensor's name instead of a shape error deep inside torch.
"""

from __future__ import annotations

import contextlib
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


def destinations(cfg: DecoderConfig) -> dict[str, tuple[str, tuple]]:
    """Where each checkpoint tensor goes: a parameter of `DecoderLM` and the part of it
    (rows of a fused matrix, an expert of a stacked one; `()` for the whole)."""
    qs, kv, out = cfg.q_size, cfg.kv_size, {}
    out["model.embed_tokens.weight"] = ("embed.weight", ())
    out["model.norm.weight"] = ("norm.weight", ())
    if not cfg.tie_word_embeddings:
        out["lm_head.weight"] = ("lm_head.weight", ())
    for i in range(cfg.num_layers):
        p, q = f"model.layers.{i}.", f"layers.{i}."
        out[p + "input_layernorm.weight"] = (q + "input_norm.weight", ())
        out[p + "post_attention_layernorm.weight"] = (q + "post_attn_norm.weight", ())
        # q, k and v fused into one matrix, in that order (`decoder.Attention`).
        for name, rows in (("q", slice(0, qs)), ("k", slice(qs, qs + kv)), ("v", slice(qs + kv, qs + 2 * kv))):
            out[p + f"self_attn.{name}_proj.weight"] = (q + "attn.qkv.weight", (rows,))
            if cfg.attention_bias:
                out[p + f"self_attn.{name}_proj.bias"] = (q + "attn.qkv.bias", (rows,))
        out[p + "self_attn.o_proj.weight"] = (q + "attn.o.weight", ())
        if cfg.qk_norm:
            out[p + "self_attn.q_norm.weight"] = (q + "attn.q_norm.weight", ())
            out[p + "self_attn.k_norm.weight"] = (q + "attn.k_norm.weight", ())
        if cfg.is_moe_layer(i):  # experts stacked: gate+up and down (`moe.py`)
            names, inter = expert_names(cfg, p), cfg.moe_intermediate_size
            out[names["router"]] = (q + "mlp.router.weight", ())
            for e in range(cfg.num_experts):
                out[names["gate"].format(e)] = (q + "mlp.gate_up", (e, slice(0, inter)))
                out[names["up"].format(e)] = (q + "mlp.gate_up", (e, slice(inter, 2 * inter)))
                out[names["down"].format(e)] = (q + "mlp.down", (e,))
            if cfg.shared_expert_intermediate_size:
                s, sh = p + "mlp.shared_expert.", cfg.shared_expert_intermediate_size
                out[s + "gate_proj.weight"] = (q + "mlp.shared.gate_up.weight", (slice(0, sh),))
                out[s + "up_proj.weight"] = (q + "mlp.shared.gate_up.weight", (slice(sh, 2 * sh),))
                out[s + "down_proj.weight"] = (q + "mlp.shared.down.weight", ())
                out[p + "mlp.shared_expert_gate.weight"] = (q + "mlp.shared_gate.weight", ())
            continue
        inter = cfg.intermediate_size
        out[p + "mlp.gate_proj.weight"] = (q + "mlp.gate_up.weight", (slice(0, inter),))
        out[p + "mlp.up_proj.weight"] = (q + "mlp.gate_up.weight", (slice(inter, 2 * inter),))
        out[p + "mlp.down_proj.weight"] = (q + "mlp.down.weight", ())
    return out


@contextlib.contextmanager
def open_checkpoint(model_dir: Path, cfg: DecoderConfig):
    """Each expected tensor's open file, after every name and shape was checked (read
    from the headers: no tensor is loaded yet)."""
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise ModelError(f"model folder {model_dir} has no *.safetensors file")
    wanted = expected_shapes(cfg)
    where, shapes = {}, {}
    with contextlib.ExitStack() as stack:
        for f in files:
            try:
                fh = stack.enter_context(safe_open(str(f), framework="pt"))
                for name in fh.keys():
                    if name in wanted:
                        where[name], shapes[name] = (fh, f), tuple(fh.get_slice(name).get_shape())
            except Exception as e:  # safetensors raises its own error types for corrupt files
                raise ModelError(f"cannot read {f}: {e}") from None
        missing = [n for n in wanted if n not in where]
        if missing:
            raise ModelError(f"{model_dir}: missing tensor {missing[0]}" + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""))
        for name, shape in wanted.items():
            if shapes[name] != shape:
                raise ModelError(f"{model_dir}: tensor {name} has shape {shapes[name]}, expected {shape}")
        yield where


def hash_tensor(h, name: str, tensor: torch.Tensor) -> None:
    """Adds a tensor to the weights' fingerprint. Large tensors are hashed on a strided
    sample of at most 256K elements so that fingerprinting a multi-GB model stays cheap;
    any real re-training or different seed changes every sample."""
    t = tensor.reshape(-1)
    sample = t[:: max(1, t.numel() // 262144)].contiguous()
    h.update(name.encode())
    h.update(str(tuple(tensor.shape)).encode())
    h.update(sample.view(torch.int16 if sample.dtype == torch.bfloat16 else torch.uint8).numpy().tobytes())


def load_decoder(model_dir: str | Path, dtype: str | torch.dtype = "float32",
                 device: torch.device | str = "cpu") -> tuple[DecoderLM, str]:
    """Returns the model (eval mode, in `dtype`, on `device`) and its fingerprint
    (architecture, shapes and a hash of the checkpoint's weights: the same on every
    device and in every dtype, so sequences move between a CPU and a GPU worker).

    The parameters are allocated on the device first and each checkpoint tensor is
    copied into its place as it is read (from the file's memory map), so the host never
    holds more than one tensor of the model: a GPU worker loads a model larger than its
    host's free memory."""
    model_dir = Path(model_dir)
    cfg = load_decoder_config(model_dir)
    tdtype = parse_dtype(dtype)
    with torch.device("meta"):
        model = DecoderLM(cfg)
    model = model.to(tdtype).to_empty(device=device)
    params = dict(model.named_parameters())
    places = destinations(cfg)
    h = hashlib.sha256(json.dumps(cfg.shape_dict(), sort_keys=True).encode())
    with open_checkpoint(model_dir, cfg) as where, torch.no_grad():
        for name in sorted(where):
            fh, path = where[name]
            try:
                tensor = fh.get_tensor(name)
            except Exception as e:
                raise ModelError(f"cannot read tensor {name} from {path}: {e}") from None
            hash_tensor(h, name, tensor)
            param, part = places[name]
            params[param][part].copy_(tensor)
    if cfg.tie_word_embeddings:
        model.lm_head.weight = model.embed.weight
    model.rope.to(device)
    model.eval()
    return model, f"{cfg.architecture}:{h.hexdigest()[:32]}"
