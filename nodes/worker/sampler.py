"""Token sampling whose randomness is a pure function of where the token is.

Each draw uses one uniform number computed from (seed, sequence key, operation index,
token position) by a counter-based hash (splitmix64), never from a stateful generator,
so a sequence samples the same tokens alone, in any batch, and after moving to another
worker. The uniform picks a token by inverse CDF over the filtered distribution.
"""

from __future__ import annotations

import hashlib

import torch

from shoal.sampling import SamplingParams

_MASK = (1 << 64) - 1


def _mix(z: int) -> int:
    z = (z + 0x9E3779B97F4A7C15) & _MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return z ^ (z >> 31)


def sequence_key(seq_id) -> int:
    return int.from_bytes(hashlib.blake2b(str(seq_id).encode(), digest_size=8).digest(), "little")


def uniform(seed: int, seq_key: int, op_index: int, position: int) -> float:
    z = _mix(seed & _MASK)
    z = _mix(z ^ seq_key)
    z = _mix(z ^ (op_index & _MASK))
    z = _mix(z ^ (position & _MASK))
    return (z >> 11) * (1.0 / (1 << 53))


def sample(logits: torch.Tensor, params: list[SamplingParams], uniforms: list[float]) -> tuple[list[int], torch.Tensor | None]:
    """logits: [B, V] fp32. Returns the chosen ids and, when any row asks for margins,
    the top-1 minus top-2 logit of every row."""
    top2 = torch.topk(logits, 2, dim=-1) if any(p.return_margins for p in params) else None
    chosen = logits.argmax(dim=-1)
    rows = [i for i, p in enumerate(params) if not p.greedy]
    if rows:
        idx = torch.tensor(rows)
        sub = logits[idx].double()
        temps = torch.tensor([params[i].temperature for i in rows], dtype=torch.float64).unsqueeze(1)
        sorted_logits, order = torch.sort(sub / temps, dim=-1, descending=True, stable=True)
        vocab = sub.shape[1]
        ranks = torch.arange(vocab).unsqueeze(0)
        top_k = torch.tensor([params[i].top_k or vocab for i in rows]).unsqueeze(1)
        sorted_logits = sorted_logits.masked_fill(ranks >= top_k, float("-inf"))
        probs = torch.softmax(sorted_logits, dim=-1)
        top_p = torch.tensor([params[i].top_p for i in rows], dtype=torch.float64).unsqueeze(1)
        before = torch.cumsum(probs, dim=-1) - probs  # mass strictly before each token
        probs = probs.masked_fill(before >= top_p, 0.0)  # always keeps the first token
        cdf = torch.cumsum(probs, dim=-1)
        u = torch.tensor([uniforms[i] for i in rows], dtype=torch.float64).unsqueeze(1) * cdf[:, -1:]
        # Rounding can put u at the very top of the CDF: clamp to the last token kept.
        last_kept = (probs > 0).sum(dim=-1, keepdim=True) - 1
        pick = torch.minimum(torch.searchsorted(cdf, u, right=True), last_kept)
        chosen[idx] = order.gather(1, pick).squeeze(1)
    margins = (top2.values[:, 0] - top2.values[:, 1]) if top2 is not None else None
    return chosen.tolist(), margins
