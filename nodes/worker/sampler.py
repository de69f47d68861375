"""Token sampling whose randomness is a pure function of where the token is.

Each draw uses one uniform number computed from (seed, sequence key, operation index,
token position) by a counter-based hash (splitmix64), never from a stateful generator,
so a sequence draws the same uniform alone, in any batch, and after moving to another
worker. The uniform picks a token by inverse CDF over the filtered distribution.

The CDF runs over the kept tokens in *token-id order*, not in order of probability.
Logits of the same context computed in another batch shape differ by rounding (~1e-6 in
fp32); in probability order two tokens whose logits lie that close swap places, moving
both their intervals by a whole token's probability, so a uniform in either interval
picks the other token. On a flat distribution over a large vocabulary such swaps sit
everywhere, and seeded outputs parted after moves and between workers. In id order a
rounding change moves every CDF boundary by about the size of the change, so a draw
changes only when its uniform lies that close to a boundary, or when rounding moves the
top-k / top-p cut; `Draw` records both distances, and the shared comparator
(`shoal.output_compare`) lets two runs part only there.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import torch

from shoal.nodes.worker.device_copy import to_device
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


@dataclass(frozen=True)
class Draw:
    """One sampled token as the comparator needs it: the uniform, the chosen token's
    interval [lo, hi) of the normalized CDF (u lies in it), and `cut`, how far rounding
    is from moving the top-k / top-p cut (the tempered-logit gap at the cut, or the
    kept mass's distance from top_p; None when nothing was filtered out)."""

    u: float
    lo: float
    hi: float
    cut: float | None = None

    def to_list(self) -> list:
        return [self.u, self.lo, self.hi, self.cut]


def _filter(scaled: torch.Tensor, probs: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor):
    """The top-k then top-p filter: a keep mask in id order, and per row the distance
    rounding would need to move the cut. scaled: tempered logits [R, V] float64; probs:
    their softmax."""
    vocab, dev = scaled.shape[1], scaled.device
    sorted_logits, order = torch.sort(scaled, dim=-1, descending=True, stable=True)
    ranks = torch.arange(vocab, device=dev).unsqueeze(0)
    in_k = ranks < top_k
    # top-p runs on the distribution renormalized over the top-k tokens.
    sp = probs.gather(1, order) * in_k
    sp = sp / sp.sum(dim=-1, keepdim=True)
    before = torch.cumsum(sp, dim=-1) - sp  # mass strictly before each token
    keep_sorted = in_k & (before < top_p)  # always keeps the first token
    kept = keep_sorted.sum(dim=-1, keepdim=True)  # >= 1
    rows = torch.arange(scaled.shape[0], device=dev).unsqueeze(1)
    last = kept - 1
    nxt = kept.clamp(max=vocab - 1)
    inf = torch.full_like(top_p, float("inf"))
    gap = torch.where(kept < vocab, sorted_logits[rows, last] - sorted_logits[rows, nxt], inf)
    filtering_p = top_p < 1.0
    above = torch.where(filtering_p & (last > 0), top_p - before[rows, last], inf)
    below = torch.where(filtering_p & (kept < vocab), (before[rows, nxt] - top_p).abs(), inf)
    cut = torch.minimum(gap, torch.minimum(above, below)).squeeze(1)
    keep = torch.zeros_like(keep_sorted).scatter(1, order, keep_sorted)
    return keep, cut


def sample(logits: torch.Tensor, params: list[SamplingParams], uniforms: list[float], row_top2=None
           ) -> tuple[list[int], torch.Tensor | None, dict[int, Draw]]:
    """logits: [B, V] fp32 or bf16 (a bf16 model's; every value widens to fp32 exactly,
    so the picks and margins are those of the fp32 copy). Returns the chosen ids; when
    any row asks for margins, the top-1 minus top-2 logit of every row (on the host); and
    the `Draw` of every sampled row that asks for margins, by row. `row_top2`: the native
    op that makes both in one pass (the first index of a tied maximum, as argmax), else
    torch's argmax and topk. On a GPU everything runs there (`pick`), and what is read
    back is the chosen ids, and the margins and draws where asked for."""
    chosen, margins, sampled = pick(logits, params, uniforms, row_top2)
    draws: dict[int, Draw] = {}
    if sampled is not None and any(params[i].return_margins for i in sampled[0]):
        rows, lo, hi, cut = sampled
        draws = draws_of(rows, lo.tolist(), hi.tolist(), cut.tolist(), params, uniforms)
    return chosen.tolist(), (margins.cpu() if margins is not None else None), draws


def draws_of(rows: list[int], lo: list[float], hi: list[float], cut: list[float], params: list[SamplingParams],
             uniforms: list[float]) -> dict[int, Draw]:
    """`pick`'s sampled rows' figures, read back, as the `Draw` of each that asks for margins."""
    return {i: Draw(uniforms[i], a, b, None if c == float("inf") else c)
            for i, a, b, c in zip(rows, lo, hi, cut) if params[i].return_margins}


# Bytes of one [rows, vocab] float64 tensor of a sampled chunk: the draw holds about ten
# at once (tempered logits, probabilities, the filter's sorted copies, the CDF). At 1,024
# rows of a 152k vocabulary that would be 12-14 GB of the device, all of it taken from
# the KV cache by the memory profile; in chunks of 128 MiB, about 1.3 GB.
SAMPLE_CHUNK_BYTES = 128 << 20


def chunk_rows(vocab: int) -> int:
    """Sampled rows drawn together: each row's draw depends on its own logits only, so
    drawing in chunks gives the same tokens as drawing all at once."""
    return max(1, SAMPLE_CHUNK_BYTES // (vocab * 8))


def pick(logits: torch.Tensor, params: list[SamplingParams], uniforms: list[float], row_top2=None,
         rows_per_chunk: int | None = None):
    """`sample`'s tensor work, on the logits' device with no read back: the chosen ids
    [B], the margins [B] or None, and for the sampled rows (row indices, each draw's
    interval lo and hi [R], the cut's distance [R], inf where nothing was cut), or None.
    The sampled rows are drawn `rows_per_chunk` at a time (default: `chunk_rows`)."""
    dev = logits.device
    if row_top2 is not None and logits.is_contiguous() and dev.type == "cpu":
        chosen, margins = row_top2(logits)
        if not any(p.return_margins for p in params):
            margins = None
    else:
        logits = logits.float()
        top2 = torch.topk(logits, 2, dim=-1) if any(p.return_margins for p in params) else None
        chosen = logits.argmax(dim=-1)
        margins = (top2.values[:, 0] - top2.values[:, 1]) if top2 is not None else None
    rows = [i for i, p in enumerate(params) if not p.greedy]
    if not rows:
        return chosen, margins, None
    step = rows_per_chunk or chunk_rows(logits.shape[1])
    parts = [_draw(logits, chosen, rows[at:at + step], params, uniforms) for at in range(0, len(rows), step)]
    if len(parts) == 1:
        return chosen, margins, (rows, *parts[0])
    return chosen, margins, (rows, *(torch.cat(p) for p in zip(*parts)))


def _draw(logits: torch.Tensor, chosen: torch.Tensor, rows: list[int], params: list[SamplingParams],
          uniforms: list[float]):
    """Draws `rows` of `logits` into `chosen`; each draw's interval lo and hi, and the cut's
    distance, [len(rows)] each."""
    dev = logits.device
    idx = to_device(rows, dev)
    temps = to_device([params[i].temperature for i in rows], dev, torch.float64).unsqueeze(1)
    scaled = logits[idx].double() / temps
    probs = torch.softmax(scaled, dim=-1)
    vocab = scaled.shape[1]
    filtered = [j for j, i in enumerate(rows) if 0 < params[i].top_k < vocab or params[i].top_p < 1.0]
    cut = torch.full((len(rows),), float("inf"), dtype=torch.float64, device=dev)
    if filtered:
        f = to_device(filtered, dev)
        top_k = to_device([params[rows[j]].top_k or vocab for j in filtered], dev).unsqueeze(1)
        top_p = to_device([params[rows[j]].top_p for j in filtered], dev, torch.float64).unsqueeze(1)
        keep, cut[f] = _filter(scaled[f], probs[f], top_k, top_p)
        probs[f] = probs[f] * keep
    cdf = torch.cumsum(probs, dim=-1)
    total = cdf[:, -1:]
    u = to_device([uniforms[i] for i in rows], dev, torch.float64).unsqueeze(1)
    # The first token whose CDF exceeds u; rounding can put u*total at the very top,
    # so it is clamped to the last token kept (the highest id with mass).
    last_kept = vocab - 1 - torch.argmax((probs > 0).flip(-1).to(torch.int8), dim=-1, keepdim=True)
    chosen_rows = torch.minimum(torch.searchsorted(cdf, u * total, right=True), last_kept)
    hi = cdf.gather(1, chosen_rows)
    lo = hi - probs.gather(1, chosen_rows)
    chosen[idx] = chosen_rows.squeeze(1)
    return (lo / total).squeeze(1), (hi / total).squeeze(1), cut
