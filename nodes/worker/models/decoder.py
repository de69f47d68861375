"""The Qwen3 / Qwen2 / Llama decoder over a flat batch of tokens.

A step's tokens from every sequence are concatenated into one `[T]` batch, so each
projection is a single matrix multiply whatever mix of prefill and decode the step
holds; only attention looks at sequence boundaries (through `AttentionMetadata`).
"""

from __future__ import annotations

import torch
from torch import nn

from shoal.nodes.worker.attention import AttentionMetadata, paged_attention
from shoal.nodes.worker.models.config import DecoderConfig
from shoal.nodes.worker.models.layers import RMSNorm, RotaryEmbedding, SwiGLU, apply_rope


class Attention(nn.Module):
    def __init__(self, cfg: DecoderConfig):
        super().__init__()
        self.cfg = cfg
        # q, k and v fused into one matrix (split again after the matmul).
        self.qkv = nn.Linear(cfg.hidden_size, cfg.q_size + 2 * cfg.kv_size, bias=cfg.attention_bias)
        self.o = nn.Linear(cfg.q_size, cfg.hidden_size, bias=False)
        if cfg.qk_norm:
            self.q_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps)
            self.k_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps)
        self.scale = cfg.head_dim**-0.5

    def forward(self, x, cos, sin, kv_cache, meta: AttentionMetadata):
        cfg = self.cfg
        T = x.shape[0]
        q, k, v = self.qkv(x).split([cfg.q_size, cfg.kv_size, cfg.kv_size], dim=-1)
        q = q.view(T, cfg.num_heads, cfg.head_dim)
        k = k.view(T, cfg.num_kv_heads, cfg.head_dim)
        v = v.view(T, cfg.num_kv_heads, cfg.head_dim)
        if cfg.qk_norm:
            q = self.q_norm(q)
            k = self.k_norm(k)
        q = apply_rope(q, cos, sin)
        k = apply_rope(k, cos, sin)
        o = paged_attention(q, k, v, kv_cache, meta, self.scale)
        return self.o(o.reshape(T, cfg.q_size))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: DecoderConfig):
        super().__init__()
        self.input_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.attn = Attention(cfg)
        self.post_attn_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = SwiGLU(cfg.hidden_size, cfg.intermediate_size)

    def forward(self, x, cos, sin, kv_cache, meta):
        x = x + self.attn(self.input_norm(x), cos, sin, kv_cache, meta)
        return x + self.mlp(self.post_attn_norm(x))


class DecoderLM(nn.Module):
    def __init__(self, cfg: DecoderConfig):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.embed.weight
        self.rope = RotaryEmbedding(cfg.head_dim, cfg.max_position_embeddings, cfg.rope_theta)

    @torch.inference_mode()
    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: list[torch.Tensor],
        meta: AttentionMetadata,
        logit_rows: torch.Tensor,
    ) -> torch.Tensor:
        """Runs the step's tokens; returns fp32 logits for `logit_rows` only (the
        tokens that sample), since the vocabulary projection is costly."""
        x = self.embed(input_ids)
        cos, sin = self.rope.tables(positions, x.dtype)
        for layer, cache in zip(self.layers, kv_caches):
            x = layer(x, cos, sin, cache, meta)
        x = self.norm(x[logit_rows])
        return self.lm_head(x).float()
