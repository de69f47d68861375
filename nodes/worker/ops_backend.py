"""The seam between the decoder and the device: one ops backend, chosen once at start.

The decoder's paged forward (`models/decoder.py`) is its matrix multiplies plus five
calls into a backend: `rms_norm` (with the residual add), `qkv_rope_cache` (qk-norm,
RoPE, K and V into the cache), `attend` (paged attention over the step's spans),
`silu_mul`, and the sampler's `row_top2` where the backend has one. Three backends:

- `NativeOps`: the CPU's compiled kernels (`kernels/`), the fast path on a CPU;
- `TritonOps`: the GPU's, paged attention (`kernels/triton_attention.py`) and the fused
  elementwise ops (`kernels/triton_fused_ops.py`) in Triton;
- `TorchOps`: every op in plain torch on whatever device its tensors are on (gather +
  `scaled_dot_product_attention` for attention). It is the fallback where neither of
  the others runs, and the oracle in tests.

`attention="sdpa"` (no backend) keeps the decoder's op-by-op reference forward, which
tests compare every backend with. Nothing in a backend reads a device tensor back to
the host: the spans' longest row count and context come from the runner, which knows
them (`AttentionMetadata.span_max_len`, `span_max_ctx`).
"""

from __future__ import annotations

import logging
import os

import torch
import torch.nn.functional as F

log = logging.getLogger(__name__)

ATTENTION_CHOICES = ("auto", "native", "triton", "torch", "sdpa")


class TorchOps:
    """The ops in torch, on any device: what the native kernels compute, op by op as the
    Hugging Face formulation rounds them."""

    name = "torch"
    row_top2 = None  # the sampler's torch argmax / topk

    def rms_norm(self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        if residual.numel():  # the residual stream becomes x + residual, in place
            residual.add_(x)
            x = residual
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
        return weight * h.to(x.dtype)

    def qkv_rope_cache(self, qkv, q_norm, k_norm, cos, sin, positions, slots, k_cache, v_cache, H: int, KVH: int,
                       eps: float) -> torch.Tensor:
        from shoal.nodes.worker.models.layers import apply_rope

        T, D = positions.shape[0], cos.shape[1]
        q, k, v = qkv[:T].split([H * D, KVH * D, KVH * D], dim=-1)
        q, k, v = q.reshape(T, H, D), k.reshape(T, KVH, D), v.reshape(T, KVH, D)
        if q_norm.numel():
            q, k = self.rms_norm(q, q.new_empty(0), q_norm, eps), self.rms_norm(k, k.new_empty(0), k_norm, eps)
        c, s = cos[positions].to(qkv.dtype).unsqueeze(1), sin[positions].to(qkv.dtype).unsqueeze(1)
        q, k = apply_rope(q, c, s), apply_rope(k, c, s)
        k_cache.index_copy_(0, slots, k.to(k_cache.dtype))
        v_cache.index_copy_(0, slots, v.to(v_cache.dtype))
        return q.contiguous()

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        gate, up = gate_up.chunk(2, dim=-1)
        return F.silu(gate) * up

    def attend(self, q: torch.Tensor, kv_cache: torch.Tensor, meta, scale: float, out: torch.Tensor) -> None:
        """Every span at once: queries padded to the longest span, keys gathered up to
        the longest context, one masked SDPA call with the query heads of each KV group
        folded into the query axis."""
        rows, lens, ctx, table, bs = meta.span_rows, meta.span_lens, meta.span_ctx, meta.span_tables, meta.block_size
        S, (H, D), kvh = rows.shape[0], q.shape[1:], kv_cache.shape[2]
        n, L, G, dev = meta.span_max_len, meta.span_max_ctx, H // kvh, q.device
        wide = torch.promote_types(q.dtype, kv_cache.dtype)  # as the native kernel's fp32 loops compute
        i = torch.arange(n, device=dev)
        q_rows = rows[:, None] + torch.minimum(i[None, :], lens[:, None] - 1)  # padding repeats a span's last row
        key_pos = torch.minimum(torch.arange(L, device=dev)[None, :], ctx[:, None] - 1)  # [S, L]
        slots = table.gather(1, key_pos // bs) * bs + key_pos % bs
        k = kv_cache[0][slots].to(wide).permute(0, 2, 1, 3)  # [S, KVH, L, D]
        v = kv_cache[1][slots].to(wide).permute(0, 2, 1, 3)
        qs = q[q_rows].to(wide).view(S, n, kvh, G, D).permute(0, 2, 1, 3, 4).reshape(S, kvh, n * G, D)
        q_pos = (ctx - lens)[:, None] + i[None, :]  # [S, n]
        mask = torch.arange(L, device=dev)[None, None, :] <= q_pos[:, :, None]  # [S, n, L]
        mask = mask.repeat_interleave(G, dim=1).unsqueeze(1)  # [S, 1, n * G, L]
        o = F.scaled_dot_product_attention(qs, k, v, attn_mask=mask, scale=scale)
        o = o.view(S, kvh, n, G, D).permute(0, 2, 1, 3, 4).reshape(S, n, H, D)
        # Padding rows land on a scratch row past the end: a boolean mask would read its
        # count back from the device.
        dest = torch.where(i[None, :] < lens[:, None], q_rows, out.shape[0])
        ext = torch.cat([out, out.new_empty(1, H, D)])
        ext.index_copy_(0, dest.reshape(-1), o.reshape(-1, H, D).to(out.dtype))
        out.copy_(ext[:-1])


class TritonOps(TorchOps):
    """Paged attention and the fused elementwise ops in Triton (`kernels/triton_*.py`);
    a head dim that is no power of two takes torch's qk-norm and RoPE."""

    name = "triton"

    def rms_norm(self, x, residual, weight, eps):
        from shoal.nodes.worker.kernels.triton_fused_ops import rms_norm

        return rms_norm(x, residual, weight, eps)

    def qkv_rope_cache(self, qkv, q_norm, k_norm, cos, sin, positions, slots, k_cache, v_cache, H, KVH, eps):
        D = cos.shape[1]
        if D & (D - 1):
            return super().qkv_rope_cache(qkv, q_norm, k_norm, cos, sin, positions, slots, k_cache, v_cache, H, KVH, eps)
        from shoal.nodes.worker.kernels.triton_fused_ops import qkv_rope_cache

        return qkv_rope_cache(qkv, q_norm, k_norm, cos, sin, positions, slots, k_cache, v_cache, H, KVH, eps)

    def silu_mul(self, gate_up):
        from shoal.nodes.worker.kernels.triton_fused_ops import silu_mul

        return silu_mul(gate_up)

    def attend(self, q, kv_cache, meta, scale, out) -> None:
        from shoal.nodes.worker.kernels.triton_attention import paged_attention

        paged_attention(q, kv_cache[0], kv_cache[1], meta.span_tables, meta.span_rows, meta.span_lens, meta.span_ctx,
                        meta.block_size, scale, out, meta.span_max_len)


class NativeOps:
    """The CPU's compiled kernels (`kernels/__init__.py`), under the backend's names; the
    module's diagnostics (`bf16_dots_available`, ...) are reached through it too."""

    name = "native"

    def __init__(self, module):
        self.module = module
        self.rms_norm = module.rms_norm
        self.qkv_rope_cache = module.qkv_rope_cache
        self.silu_mul = module.silu_mul
        self.row_top2 = module.row_top2

    def attend(self, q, kv_cache, meta, scale, out) -> None:
        self.module.paged_attention(q, kv_cache[0], kv_cache[1], meta.span_tables, meta.span_rows, meta.span_lens,
                                   meta.span_ctx, meta.block_size, scale, out)

    def __getattr__(self, name):
        return getattr(self.module, name)


def triton_runs_on(device: torch.device) -> str | None:
    """Why Triton cannot run on `device` here, or None when it can: a GPU, or any device
    under the interpreter (`TRITON_INTERPRET=1`, the tests)."""
    try:
        import triton  # noqa: F401
    except ImportError:
        return "Triton is not installed"
    if device.type == "cuda" or os.environ.get("TRITON_INTERPRET") == "1":
        return None
    return f"Triton kernels run on a GPU (or under TRITON_INTERPRET=1), not on {device.type}"


def choose_ops(requested: str, device: torch.device, head_dim: int):
    """The backend for `requested` (one of ATTENTION_CHOICES) on `device`, or None for
    the reference forward; and why, for the log and `shoal nodes`."""
    if requested not in ATTENTION_CHOICES:
        raise ValueError(f"unknown attention backend {requested!r}; choose one of {', '.join(ATTENTION_CHOICES)}")
    cpu = device.type == "cpu"
    if requested == "auto":
        requested = "native" if cpu else "triton"
        if requested == "triton" and (why := triton_runs_on(device)):
            return TorchOps(), f"auto: {why}; paged attention in torch (gather + SDPA)"
    if requested == "sdpa":
        return None, "the reference forward (gather + SDPA), as asked"
    if requested == "torch":
        return TorchOps(), "torch ops (gather + SDPA), as asked"
    if requested == "triton":
        if why := triton_runs_on(device):
            raise ValueError(f"attention triton: {why}")
        return TritonOps(), "Triton paged attention and fused elementwise ops"
    if not cpu:
        raise ValueError(f"attention native: the native ops are CPU kernels; on {device} choose auto, triton or torch")
    from shoal.nodes.worker.kernels import native_ops

    module = native_ops()
    if module is None:
        return None, "the native ops could not be built here: the reference forward (gather + SDPA)"
    if not module.supports_head_dim(head_dim):
        log.warning("[engine] head_dim %d has no native attention build; using gather + SDPA", head_dim)
        return None, f"head_dim {head_dim} has no native build: the reference forward (gather + SDPA)"
    return NativeOps(module), "the native CPU kernels"
