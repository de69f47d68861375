""""The same output", as every Shoal test and benchmark judges it (DESIGN.md).

Two runs of a sequence produce the same output when their tokens are identical up to
the first step whose top-two logits lie within `tol` of each other (a near-tie); from
that step on, rounding alone may pick the other token, so the runs may part there and
only there. Margins are the top-1 minus top-2 logit per generated token, recorded with
`SamplingParams(return_margins=True)`; pass those of either run or both.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

# Tolerances on the top-two logit gap. fp32 logits of the same tokens computed with
# different batch shapes differ by ~1e-5 here; bf16 ones by up to a few 1e-2.
FP32_TOL = 1e-3
BF16_TOL = 0.25


@dataclass(frozen=True)
class Comparison:
    same: bool
    diverged_at: int | None  # first differing position, None if identical
    near_tie_at: int | None  # first near-tie at or before the divergence
    detail: str

    def __bool__(self) -> bool:
        return self.same


def compare_outputs(a: Sequence[int], b: Sequence[int], margins: Sequence[Sequence[float]] = (),
                    tol: float = FP32_TOL) -> Comparison:
    a, b = list(a), list(b)
    n = min(len(a), len(b))
    diverged = next((i for i in range(n) if a[i] != b[i]), None)
    if diverged is None and len(a) != len(b):
        diverged = n  # one stopped where the other went on
    if diverged is None:
        return Comparison(True, None, None, "identical")
    lowest = []
    for i in range(diverged + 1):
        vals = [m[i] for m in margins if i < len(m)]
        lowest.append(min(vals) if vals else float("inf"))
    tie = next((i for i, m in enumerate(lowest) if m < tol), None)
    if tie is not None:
        return Comparison(True, diverged, tie, f"parted at {diverged} after a near-tie at {tie} (gap {lowest[tie]:.2e} < {tol})")
    gap = lowest[diverged] if lowest else float("nan")
    return Comparison(False, diverged, None,
                      f"differ at token {diverged} ({a[diverged:diverged + 3]} vs {b[diverged:diverged + 3]}) with no near-tie before it (gap there {gap:.2e}, tol {tol})")


def compare_generations(a: Sequence[dict], b: Sequence[dict], tol: float = FP32_TOL) -> Comparison:
    """Two runs of a program, by its Generate results in order (dicts with token_ids
    and margins): the same while each pair is identical; a pair that parts after a
    near-tie is the same output, and what follows it (built from different text) is
    not compared."""
    for i, (x, y) in enumerate(zip(a, b)):
        cmp = compare_outputs(x["token_ids"], y["token_ids"], [x.get("margins", ()), y.get("margins", ())], tol)
        if not cmp:
            return Comparison(False, cmp.diverged_at, None, f"generation {i}: {cmp.detail}")
        if cmp.diverged_at is not None:
            return Comparison(True, cmp.diverged_at, cmp.near_tie_at, f"generation {i}: {cmp.detail}")
    if len(a) != len(b):
        return Comparison(False, None, None, f"{len(a)} generations vs {len(b)} with identical tokens before")
    return Comparison(True, None, None, "identical")


SCORE_TOL = 1e-5  # retrieval scores of the same query embedded in different batches


def compare_rag(a: dict, b: dict, tol: float = FP32_TOL, score_tol: float = SCORE_TOL) -> Comparison:
    """Two runs of an `ircot` item (run with trace=True: each hop has passages, scores,
    token_ids, margins), hop by hop. Retrieval parts legitimately only where the two
    runs' hits at the first differing rank score within `score_tol` of each other (a
    near-tie, broken by rounding); generation, as `compare_outputs`. After a legitimate
    parting nothing more is compared."""
    for i, (x, y) in enumerate(zip(a["hops"], b["hops"])):
        if x["passages"] != y["passages"]:
            j = next((j for j, (p, q) in enumerate(zip(x["passages"], y["passages"])) if p != q),
                     min(len(x["passages"]), len(y["passages"])))
            sx, sy = x["scores"], y["scores"]
            if j < len(sx) and j < len(sy) and abs(sx[j] - sy[j]) < score_tol:
                return Comparison(True, i, i, f"hop {i}: retrieval parted at rank {j} on a near-tie "
                                               f"({sx[j]:.7f} vs {sy[j]:.7f})")
            return Comparison(False, i, None, f"hop {i}: passages {x['passages']} vs {y['passages']} "
                                              f"(scores {sx} vs {sy})")
        cmp = compare_outputs(x["token_ids"], y["token_ids"], [x.get("margins", ()), y.get("margins", ())], tol)
        if not cmp:
            return Comparison(False, i, None, f"hop {i} thought: {cmp.detail}")
        if cmp.diverged_at is not None:
            return Comparison(True, i, i, f"hop {i} thought: {cmp.detail}")
    if len(a["hops"]) != len(b["hops"]):
        return Comparison(False, None, None, f"{len(a['hops'])} hops vs {len(b['hops'])} with the same ones before")
    return Comparison(True, None, None, "identical")
