"""The Qwen3 / Qwen2 / Llama decoder over a flat batch of tokens.

A step's tokens from every sequence are concatenated into one `[T]` batch, so each
projection is a single matrix multiply whatever mix of prefill and decode the step
holds; only attention looks at sequence boundaries (through `AttentionMetadata`).

Two forwards compute the same function. With an ops backend (`meta.ops`: the native CPU
kernels, Triton on a GPU, or torch ops; `ops_backend.py`), a layer is its matrix
multiplies plus four backend calls (RMSNorm with the residual add, qk-norm + RoPE +
cache write, paged attention, SwiGLU's activation), and the residual stream is carried
beside the hidden state as vLLM does. The reference forward is the
torch formulation, op by op, that tests compare the native one with.
"""

from __future__ import annotations

from contextlib import nullcontext

import torch
from torch import nn

from shoal.nodes.worker.attention import AttentionMetadata, paged_attention, prefill_sdpa
from shoal.nodes.worker.models.config import DecoderConfig
from shoal.nodes.worker.models.layers import RMSNorm, RotaryEmbedding, SwiGLU, apply_rope
from shoal.nodes.worker.models.moe import MoeBlock
from shoal.nodes.worker.models.row_buckets import padded_rows
from shoal.nodes.worker.step_buffers import chunk_rows


def traced(name: str):
    """A profiler range around a native call (invisible to torch.profiler otherwise), only
    while profiling: entering one costs ~7 us, 0.5% of a decode step at 48 per step."""
    if getattr(torch.autograd.profiler, "_is_profiler_enabled", True):
        return torch.profiler.record_function(name)
    return nullcontext()


def pad_to(rows: torch.Tensor, n: int) -> torch.Tensor:
    """`rows` (1-d) followed by zeros up to `n` entries (a padding row reads token 0 / row 0)."""
    return rows if rows.shape[0] >= n else torch.cat([rows, rows.new_zeros(n - rows.shape[0])])


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

    def forward_native(self, x, positions, rope, kv_cache, meta: AttentionMetadata):
        """`x` may hold padding rows after the step's tokens (`DecoderLM.pad_rows`): they
        write no cache and attend to nothing; their output is zero."""
        cfg, ops = self.cfg, meta.ops
        T = positions.shape[0]
        qkv = self.qkv(x)
        none = qkv.new_empty(0)
        with traced("shoal::qkv_rope_cache"):
            q = ops.qkv_rope_cache(qkv[:T], self.q_norm.weight if cfg.qk_norm else none,
                                   self.k_norm.weight if cfg.qk_norm else none, rope.cos, rope.sin, positions,
                                   meta.slot_mapping, kv_cache[0], kv_cache[1], cfg.num_heads, cfg.num_kv_heads,
                                   cfg.rms_norm_eps)
        # In the model's dtype: what the o projection takes.
        padded = x.new_empty((x.shape[0], cfg.num_heads, cfg.head_dim))
        out = padded
        if T < x.shape[0]:
            padded[T:].zero_()
            out = padded[:T]
        if meta.span_rows is not None:
            with traced("shoal::paged_attention"):
                ops.attend(q, kv_cache, meta, self.scale, out)
        if meta.prefills:  # large fp32 chunks on AVX2 (model_runner.py); profiled as aten's SDPA ops
            prefill_sdpa(q, kv_cache, meta.prefills, self.scale, out)
        return self.o(padded.view(x.shape[0], cfg.q_size))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: DecoderConfig, index: int = 0):
        super().__init__()
        self.input_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.attn = Attention(cfg)
        self.post_attn_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MoeBlock(cfg) if cfg.is_moe_layer(index) else SwiGLU(cfg.hidden_size, cfg.intermediate_size)

    def forward(self, x, cos, sin, kv_cache, meta):
        x = x + self.attn(self.input_norm(x), cos, sin, kv_cache, meta)
        return x + self.mlp(self.post_attn_norm(x))

    def forward_native(self, x, residual, positions, rope, kv_cache, meta):
        """x: the last sublayer's output (the embeddings for the first layer); residual:
        the stream before it (empty for the first layer), updated in place."""
        ops, eps = meta.ops, self.input_norm.eps
        with traced("shoal::rms_norm"):
            h = ops.rms_norm(x, residual, self.input_norm.weight, eps)  # no add while residual is empty
        if residual.numel() == 0:
            residual = x
        h = self.attn.forward_native(h, positions, rope, kv_cache, meta)
        with traced("shoal::rms_norm"):
            h = ops.rms_norm(h, residual, self.post_attn_norm.weight, eps)
        if isinstance(self.mlp, MoeBlock):
            with traced("shoal::moe"):
                return self.mlp(h), residual
        # The MLP's gate and up rows are the widest tensor of a step: at 4,096 tokens of
        # W1's shape 32 MiB, past what malloc keeps between steps (step_buffers.py), so
        # every step faulted it in anew (its projection took 2.2x as long). Split in equal
        # pieces under that size: W1's bf16 MLP at 4,096 rows took 18.7 ms as two pieces of
        # 2,048 against 29.9 ms whole (smaller pieces: slower again, 21-25 ms). A GPU's
        # caching allocator keeps its blocks: there, pieces would only shrink the GEMMs.
        rows = chunk_rows(h.shape[0], self.mlp.gate_up.out_features * h.element_size())
        if rows >= h.shape[0] or h.device.type != "cpu":
            return self._mlp_native(h, ops), residual
        out = torch.cat([self._mlp_native(h[i:i + rows], ops) for i in range(0, h.shape[0], rows)])
        return out, residual

    def _mlp_native(self, h, ops):
        gate_up = self.mlp.gate_up(h)
        with traced("shoal::silu_mul"):
            act = ops.silu_mul(gate_up)
        return self.mlp.down(act)


class DecoderLM(nn.Module):
    def __init__(self, cfg: DecoderConfig):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg, i) for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.embed.weight
        self.rope = RotaryEmbedding(cfg.head_dim, cfg.max_position_embeddings, cfg.rope_theta)
        self.streamer = None  # `weight_streamer.py`, when the device cannot hold every layer
        # Native forward: compute each step at a row count of `row_buckets.py` (padding
        # rows after the tokens), so that oneDNN compiles its kernels for a few sizes.
        self.pad_rows = False

    @torch.inference_mode()
    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: list[torch.Tensor],
        meta: AttentionMetadata,
        logit_rows: torch.Tensor,
        logits_out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Runs the step's tokens; returns logits for `logit_rows` only (the tokens
        that sample), since the vocabulary projection is costly. They stay in the
        model's dtype: the greedy pick reads bf16 as it is, and the sampler widens
        only the rows it samples. `logits_out` (ops path): written there, as decode
        graphs want (every captured size writes one buffer)."""
        if meta.ops is not None:
            sampled = logit_rows.shape[0]
            if self.pad_rows:
                input_ids = pad_to(input_ids, padded_rows(input_ids.shape[0]))
                logit_rows = pad_to(logit_rows, padded_rows(sampled))
            x = self.embed(input_ids)
            residual = x.new_empty(0)
            for i, (layer, cache) in enumerate(zip(self.layers, kv_caches)):
                if self.streamer is not None:
                    self.streamer.before_layer(i, x.shape[0])
                x, residual = layer.forward_native(x, residual, positions, self.rope, cache, meta)
            x = meta.ops.rms_norm(x[logit_rows], residual[logit_rows], self.norm.weight, self.norm.eps)
            if self.streamer is not None:
                self.streamer.after_step(positions.shape[0])
            if logits_out is not None:  # (F.linear's own multiply: the same product, into the buffer)
                return torch.mm(x[:sampled], self.lm_head.weight.t(), out=logits_out)
            return self.lm_head(x)[:sampled]
        x = self.embed(input_ids)
        cos, sin = self.rope.tables(positions, x.dtype)
        for i, (layer, cache) in enumerate(zip(self.layers, kv_caches)):
            if self.streamer is not None:
                self.streamer.before_layer(i, x.shape[0])
            x = layer(x, cos, sin, cache, meta)
        x = self.norm(x[logit_rows])
        if self.streamer is not None:
            self.streamer.after_step(input_ids.shape[0])
        return self.lm_head(x)
