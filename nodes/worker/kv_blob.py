"""A sequence's computed KV as it travels (migration, drain, checkpoints): safetensors,
one tensor per layer in the canonical layout [2, tokens, kv_heads, head_dim], tagged with
the model's fingerprint, and checked against this model before any of it is used."""

from __future__ import annotations

import torch
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from shoal.protocol.sequence_state import SequenceState, StateError, kv_blob_metadata


def encode_kv(tensors: torch.Tensor, fingerprint: str) -> bytes:
    """`tensors`: [layers, 2, tokens, kv_heads, head_dim]."""
    return st_save({f"layer.{i}": t.contiguous() for i, t in enumerate(tensors)},
                   metadata={"model_fingerprint": fingerprint, "num_tokens": str(tensors.shape[2])})


def decode_kv(state: SequenceState, fingerprint: str, cfg) -> torch.Tensor:
    """The state's KV as [layers, 2, tokens, kv_heads, head_dim]; StateError, naming the
    sequence, for KV of another model, of the wrong shape, or longer than the sequence."""
    sid = state.seq_id
    meta = kv_blob_metadata(state.kv)
    if meta.get("model_fingerprint") != fingerprint:
        raise StateError(f"sequence {sid!r}: KV blob is from model {meta.get('model_fingerprint')}, "
                         f"this engine runs {fingerprint}")
    tensors = st_load(state.kv)
    want = (2, state.num_computed, cfg.num_kv_heads, cfg.head_dim)
    layers = []
    for i in range(cfg.num_layers):
        t = tensors.get(f"layer.{i}")
        if t is None or tuple(t.shape) != want:
            raise StateError(f"sequence {sid!r}: KV blob layer {i} is {None if t is None else tuple(t.shape)}, "
                             f"expected {want}")
        layers.append(t)
    if state.num_computed > state_len(state):
        raise StateError(f"sequence {sid!r}: KV covers {state.num_computed} tokens, the sequence has {state_len(state)}")
    return torch.stack(layers)


def state_len(state: SequenceState) -> int:
    return len(state.prompt_token_ids) + len(state.output_token_ids)
