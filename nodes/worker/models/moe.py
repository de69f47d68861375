"""A sparse mixture-of-experts MLP (Qwen3-MoE), batched by expert.

Each token's router picks its top-k experts (softmax over the router logits in fp32,
then top-k, renormalized when the checkpoint says `norm_topk_prob`, as transformers
does). Then the step's (token, expert) pairs of every sequence are sorted by expert,
and each expert that any token chose multiplies all of its tokens at once: the larger
the step, the larger each expert's batch. Where torch has a grouped GEMM
(`torch._grouped_mm`: CPU, and bf16 on Hopper GPUs) the experts run as two grouped
multiplies whose group ends stay on the device, so a GPU step never waits on the host
for a layer's expert counts; elsewhere, and when weight streaming must fetch the chosen
experts first, one multiply per chosen expert. Outputs are weighted and summed
back into their tokens in expert order (the order transformers adds them in).

Qwen2-MoE adds a shared expert every token runs, scaled by a sigmoid gate, added after
the routed experts (as transformers adds it).

Expert weights are stacked: gate and up fused as [experts, 2 * intermediate, hidden],
down as [experts, hidden, intermediate] (`loader.py` builds them from the checkpoint's
per-expert tensors).
"""

from __future__ import annotations

import logging

import torch
import torch.nn.functional as F
from torch import nn

from shoal.nodes.worker.models.config import DecoderConfig
from shoal.nodes.worker.models.layers import SwiGLU

log = logging.getLogger(__name__)


class MoeBlock(nn.Module):
    def __init__(self, cfg: DecoderConfig):
        super().__init__()
        self.num_experts, self.top_k, self.norm_topk = cfg.num_experts, cfg.num_experts_per_tok, cfg.norm_topk_prob
        self.intermediate = cfg.moe_intermediate_size
        self.router = nn.Linear(cfg.hidden_size, cfg.num_experts, bias=False)
        self.gate_up = nn.Parameter(torch.empty(cfg.num_experts, 2 * cfg.moe_intermediate_size, cfg.hidden_size))
        self.down = nn.Parameter(torch.empty(cfg.num_experts, cfg.hidden_size, cfg.moe_intermediate_size))
        self.on_experts = None  # fn(experts chosen this step): weight streaming fetches them
        self.grouped: bool | None = None  # whether torch's grouped GEMM runs here (None: not tried yet)
        self.shared = None
        if cfg.shared_expert_intermediate_size:
            self.shared = SwiGLU(cfg.hidden_size, cfg.shared_expert_intermediate_size)
            self.shared_gate = nn.Linear(cfg.hidden_size, 1, bias=False)

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(weights [T, k] in x's dtype, experts [T, k]) of every token."""
        probs = F.softmax(self.router(x).float(), dim=-1)
        weights, experts = torch.topk(probs, self.top_k, dim=-1)
        if self.norm_topk:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return weights.to(x.dtype), experts

    def expert(self, e: int, x: torch.Tensor) -> torch.Tensor:
        gate, up = F.linear(x, self.gate_up[e]).chunk(2, dim=-1)
        return F.linear(F.silu(gate) * up, self.down[e])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights, experts = self.route(x)
        flat = experts.reshape(-1)
        order = torch.argsort(flat, stable=True)  # (token, expert) pairs grouped by expert
        tokens = order // self.top_k
        # Not bincount: on a GPU it reads the ids' min and max back to the host.
        counts = torch.zeros(self.num_experts, dtype=torch.long, device=flat.device).scatter_add_(
            0, flat, torch.ones_like(flat))
        gathered = x[tokens]
        out = None
        if self.on_experts is None and self.grouped is not False:
            out = self._grouped_experts(gathered, counts)
        if out is None:
            out = self._expert_loop(gathered, counts.tolist())
        out *= weights.reshape(-1)[order].unsqueeze(-1)
        routed = torch.zeros_like(x).index_add_(0, tokens, out)
        if self.shared is None:
            return routed
        return routed + torch.sigmoid(self.shared_gate(x)) * self.shared(x)

    def _grouped_experts(self, gathered: torch.Tensor, counts: torch.Tensor) -> torch.Tensor | None:
        """Every expert's batch in two grouped GEMMs, with no host synchronization (the
        group ends stay on the device); None where this torch build or device has no
        grouped GEMM for this dtype and shape (tried once per block, then not again)."""
        ends = torch.cumsum(counts, 0, dtype=torch.int32)
        try:
            gate, up = torch._grouped_mm(gathered, self.gate_up.transpose(1, 2), offs=ends).chunk(2, dim=-1)
            out = torch._grouped_mm(F.silu(gate) * up, self.down.transpose(1, 2), offs=ends)
        except (AttributeError, RuntimeError, NotImplementedError) as e:
            if self.grouped is None:
                log.info("[moe] no grouped GEMM here (%s: %s): one multiply per expert chosen", type(e).__name__, e)
            self.grouped = False
            return None
        self.grouped = True
        return out

    def _expert_loop(self, gathered: torch.Tensor, counts: list[int]) -> torch.Tensor:
        """One multiply per expert any token chose (a host synchronization for the
        counts); the path where weight streaming fetches the chosen experts first."""
        if self.on_experts is not None:
            self.on_experts([e for e, n in enumerate(counts) if n])
        out = torch.empty_like(gathered)
        start = 0
        for e, n in enumerate(counts):
            if n:  # experts no token chose cost nothing
                out[start:start + n] = self.expert(e, gathered[start:start + n])
                start += n
        return out

    def expert_batches(self, x: torch.Tensor) -> list[int]:
        """Tokens per expert for this input: what one step's expert batches are."""
        return torch.bincount(self.route(x)[1].reshape(-1), minlength=self.num_experts).tolist()
