"""Attention that reads keys and values through per-sequence block tables.

The KV cache of a layer is one tensor `[2, num_slots, kv_heads, head_dim]`; slot
`block * block_size + offset` holds one token. A step's tokens are laid out with all
decode tokens first (one per sequence) and then each prefill chunk, so decodes run as
one batched call and each chunk as one call.

This is the CPU path: gather the slots a sequence reads, then
`scaled_dot_product_attention`. A GPU kernel that reads block tables directly (such as
flash-attention's paged API) replaces `paged_attention` behind the same metadata.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F


@dataclass
class PrefillSpan:
    """One sequence's chunk: rows [start, end) of the step, reading `context_len` tokens."""

    start: int
    end: int
    fresh: bool  # the chunk is the sequence's whole context: causal over itself, no gather
    slots: torch.Tensor | None = None  # [context_len] cache slots to read when not fresh
    mask: torch.Tensor | None = None  # [n, context_len] bool, True = may attend


@dataclass
class AttentionMetadata:
    slot_mapping: torch.Tensor  # [T] where each new token's K/V is written
    num_decodes: int = 0
    decode_slots: torch.Tensor | None = None  # [B * L] slots, padded per sequence to L
    decode_len: int = 0  # L
    decode_mask: torch.Tensor | None = None  # [B, 1, 1, L]
    prefills: list[PrefillSpan] = field(default_factory=list)


def paged_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    kv_cache: torch.Tensor,
    meta: AttentionMetadata,
    scale: float,
) -> torch.Tensor:
    """q: [T, H, D]; k, v: [T, KVH, D]; returns [T, H, D]. Writes k, v into the cache."""
    kv_cache[0].index_copy_(0, meta.slot_mapping, k)
    kv_cache[1].index_copy_(0, meta.slot_mapping, v)
    T, H, D = q.shape
    kvh = k.shape[1]
    group = H // kvh
    out = torch.empty_like(q)
    b = meta.num_decodes
    if b:
        # Fold the query heads of a KV group into the query-length axis: one decode token
        # has no causal structure, so [B, KVH, G, D] against [B, KVH, L, D] is exact and
        # never materializes repeated keys.
        L = meta.decode_len
        kv = kv_cache[:, meta.decode_slots].view(2, b, L, kvh, D).transpose(2, 3)
        qd = q[:b].view(b, kvh, group, D)
        o = F.scaled_dot_product_attention(qd, kv[0], kv[1], attn_mask=meta.decode_mask, scale=scale)
        out[:b] = o.reshape(b, H, D)
    for span in meta.prefills:
        qs = q[span.start : span.end].transpose(0, 1).unsqueeze(0)  # [1, H, n, D]
        if span.fresh:
            ks = k[span.start : span.end]
            vs = v[span.start : span.end]
            mask, causal = None, True
        else:
            kv = kv_cache[:, span.slots]
            ks, vs = kv[0], kv[1]
            mask, causal = span.mask, False
        o = F.scaled_dot_product_attention(
            qs,
            ks.transpose(0, 1).unsqueeze(0),
            vs.transpose(0, 1).unsqueeze(0),
            attn_mask=mask,
            is_causal=causal,
            scale=scale,
            enable_gqa=group > 1,
        )
        out[span.start : span.end] = o[0].transpose(0, 1)
    return out
