"""Building blocks of the decoder: RMSNorm, rotary embedding, SwiGLU MLP.

Numerics follow the Hugging Face reference implementations (normalize in fp32, cast
back before the weight; RoPE tables in fp32) so that fp32 logits agree to ~1e-5.
"""

from __future__ import annotations

import torch
from torch import nn
import torch.nn.functional as F


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(dtype)


class RotaryEmbedding:
    """cos/sin tables for every position, indexed by each token's absolute position.

    Plain tensors, not module buffers: always fp32, built on the CPU whatever device
    context or dtype the model is built in (the loader builds on the meta device), then
    moved to the engine's device once (`to`)."""

    def __init__(self, head_dim: int, max_positions: int, theta: float):
        cpu = torch.device("cpu")
        inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64, device=cpu).float() / head_dim))
        t = torch.arange(max_positions, dtype=torch.float32, device=cpu)
        freqs = torch.outer(t, inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        self.cos = emb.cos()
        self.sin = emb.sin()

    def to(self, device: torch.device | str) -> "RotaryEmbedding":
        self.cos, self.sin = self.cos.to(device), self.sin.to(device)
        return self

    def tables(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """[T, 1, head_dim] tables for the step, built once and shared by every layer."""
        return self.cos[positions].to(dtype).unsqueeze(1), self.sin[positions].to(dtype).unsqueeze(1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [T, heads, head_dim] (rotate-half convention, as Qwen and Llama use)."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    rotated = torch.cat((-x2, x1), dim=-1)
    return x * cos + rotated * sin


class SwiGLU(nn.Module):
    """gate and up projections fused into one matrix: one matmul instead of two."""

    def __init__(self, hidden: int, intermediate: int):
        super().__init__()
        self.intermediate = intermediate
        self.gate_up = nn.Linear(hidden, 2 * intermediate, bias=False)
        self.down = nn.Linear(intermediate, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up(x).split(self.intermediate, dim=-1)
        return self.down(F.silu(gate) * up)
