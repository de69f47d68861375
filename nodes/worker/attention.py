"""Attention that reads keys and values through per-sequence block tables.

The KV cache of a layer is one tensor `[2, num_slots, kv_heads, head_dim]`; slot
`block * block_size + offset` holds one token. A step's tokens are laid out with all
decode tokens first (one per sequence) and then each prefill chunk, so decodes run as
one batched call and each chunk as one call.

Two paths share this metadata. An ops backend (`ops_backend.py`: the native CPU kernel
`kernels/paged_attention.cpp`, the Triton kernel on a GPU, or torch ops), called from
`DecoderLM`'s paged forward, takes every decode and every chunk as a *span* and reads
the cache through block tables in one call per layer. The reference path here gathers
the slots a sequence reads, then calls `scaled_dot_product_attention` (a fresh prompt:
causal SDPA on the step's own keys); tests compare the two.
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
    prefix: int = 0  # cached tokens before the chunk; without a mask, see `attend_after_prefix`


@dataclass
class AttentionMetadata:
    slot_mapping: torch.Tensor  # [T] where each new token's K/V is written
    block_size: int = 16
    num_decodes: int = 0  # the step's first rows, one token each
    ops: object = None  # the ops backend (`ops_backend.py`); None: the model's reference forward
    # Kernel path: the spans of rows it computes (every decode, then every chunk).
    span_rows: torch.Tensor | None = None  # [S] first row of each span
    span_lens: torch.Tensor | None = None  # [S] rows of each span
    span_ctx: torch.Tensor | None = None  # [S] context of each span, its own rows included
    span_tables: torch.Tensor | None = None  # [S, max_blocks] int64 block tables
    span_max_len: int = 0  # the longest span's rows and context, known on the host: a
    span_max_ctx: int = 0  # device backend sizes its launch without reading the spans back
    # Gather path: the decodes' slots padded per sequence to L, and a mask.
    decode_slots: torch.Tensor | None = None  # [B * L]
    decode_len: int = 0  # L
    decode_mask: torch.Tensor | None = None  # [B, 1, 1, L]
    prefills: list[PrefillSpan] = field(default_factory=list)  # chunks SDPA computes


def gather(cache: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """Rows of one half of a layer's cache. `index_select` on the leading dim copies whole
    rows; advanced indexing on a non-leading dim (`cache[:, slots]`) was 10x slower."""
    return torch.index_select(cache, 0, slots)


def prefill_sdpa(q: torch.Tensor, kv_cache: torch.Tensor, spans: list[PrefillSpan], scale: float,
                 out: torch.Tensor, k: torch.Tensor | None = None, v: torch.Tensor | None = None) -> None:
    """Prefill chunks through SDPA, writing rows [start, end) of `out`: the reference
    forward's, and on the native path the large fp32 chunks of an AVX2 build
    (`ModelRunner`). A chunk with `slots` reads its keys and values back from the cache,
    where the step already wrote its own; a fresh chunk without them (the reference path)
    takes its rows of the step's `k`, `v`. A fresh chunk is causal over itself, a chunk
    after a cached prefix takes `span.mask` (the reference) or, without one, runs as
    `attend_after_prefix`."""
    group = q.shape[1] // kv_cache.shape[2]
    # In the wider of the queries' and the cache's dtypes, as the native kernel's fp32
    # loops compute: an fp32 model over a bf16 cache keeps fp32 queries (the AVX512_BF16
    # dot products, which `auto` pairs with a bf16 model, round them).
    wide = torch.promote_types(q.dtype, kv_cache.dtype)
    for span in spans:
        if span.slots is None:  # the step's own keys, as the cache holds them
            ks, vs = as_cached(k[span.start : span.end], kv_cache), as_cached(v[span.start : span.end], kv_cache)
        else:
            ks, vs = gather(kv_cache[0], span.slots), gather(kv_cache[1], span.slots)
        ks, vs = ks.to(wide), vs.to(wide)
        qs = q[span.start : span.end].transpose(0, 1).unsqueeze(0).to(wide)  # [1, H, n, D]
        ks, vs = ks.transpose(0, 1).unsqueeze(0), vs.transpose(0, 1).unsqueeze(0)
        if span.fresh or span.mask is not None:
            o = F.scaled_dot_product_attention(qs, ks, vs, attn_mask=span.mask, is_causal=span.fresh,
                                               scale=scale, enable_gqa=group > 1)
        else:
            o = attend_after_prefix(qs, ks, vs, span.prefix, scale)
        out[span.start : span.end] = o[0].transpose(0, 1)


def as_cached(x: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
    """Keys or values rounded to the cache's dtype, as reading them back would give them."""
    return x if x.dtype == kv_cache.dtype else x.to(kv_cache.dtype)


def attend_after_prefix(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, prefix: int, scale: float) -> torch.Tensor:
    """A chunk after `prefix` cached tokens ([1, H, n, D] queries over [1, KVH, prefix + n,
    D] keys): every row sees the whole prefix and its own chunk causally. A mask over the
    whole rectangle makes the CPU flash kernel compute the chunk's upper triangle only to
    discard it (twice a fresh prompt's work when the prefix is short, as on a hop whose
    context window slid); instead two flash calls, unmasked over the prefix and causal over
    the chunk, merged by their log-sum-exps: with weights e^l1 and e^l2 the row is
    o2 + sigmoid(l1 - l2) (o1 - o2). The CPU flash kernel takes grouped KV heads as they are."""
    o1, l1 = _flash_with_lse(q, k[:, :, :prefix], v[:, :, :prefix], False, scale)
    o2, l2 = _flash_with_lse(q, k[:, :, prefix:], v[:, :, prefix:], True, scale)
    w = torch.sigmoid(l1 - l2).unsqueeze(-1)
    return (o2.float() + w * (o1.float() - o2.float())).to(q.dtype)


def _flash_with_lse(q, k, v, causal: bool, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention and each row's log-sum-exp of its scores: torch's CPU flash kernel, the
    one `scaled_dot_product_attention` calls on a CPU (which drops the second output)."""
    return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, causal, scale=scale)[:2]


def chunk_mask(start: int, end: int) -> torch.Tensor:
    """[end - start, end] bool, True where the chunk's row for position start + i may
    attend: every key up to its own position."""
    return torch.arange(end).unsqueeze(0) <= torch.arange(start, end).unsqueeze(1)


def paged_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    kv_cache: torch.Tensor,
    meta: AttentionMetadata,
    scale: float,
) -> torch.Tensor:
    """q: [T, H, D]; k, v: [T, KVH, D]; returns [T, H, D]. Writes k, v into the cache."""
    kv_cache[0].index_copy_(0, meta.slot_mapping, as_cached(k, kv_cache))
    kv_cache[1].index_copy_(0, meta.slot_mapping, as_cached(v, kv_cache))
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
        wide = torch.promote_types(q.dtype, kv_cache.dtype)  # as prefill_sdpa computes
        kd = gather(kv_cache[0], meta.decode_slots).view(b, L, kvh, D).transpose(1, 2).to(wide)
        vd = gather(kv_cache[1], meta.decode_slots).view(b, L, kvh, D).transpose(1, 2).to(wide)
        qd = q[:b].view(b, kvh, group, D).to(wide)
        o = F.scaled_dot_product_attention(qd, kd, vd, attn_mask=meta.decode_mask, scale=scale)
        out[:b] = o.reshape(b, H, D)
    prefill_sdpa(q, kv_cache, meta.prefills, scale, out, k, v)
    return out
