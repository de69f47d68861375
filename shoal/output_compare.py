""""The same output", as every Shoal test and benchmark judges it.

Two runs of a sequence produce the same output when they part only where rounding can
make them part. Which places those are depends on how the tokens were chosen, and
`Comparison.rule` says which rule was applied:

- greedy ("top-two gap"): tokens identical up to the first step whose top-two logits
  lie within `tol` of each other (a near-tie); from that step on rounding alone may
  pick the other token. Margins are the top-1 minus top-2 logit per generated token,
  recorded with `SamplingParams(return_margins=True)`; pass those of either run or both.
- seeded sampling ("draws"): each sampled token has a draw `[u, lo, hi, cut]` (the
  uniform, the chosen token's interval of the normalized CDF, and how far rounding is
  from moving the top-k / top-p cut; `nodes/worker/sampler.py`). Both runs must use the
  same uniform at every position (a different one means the draw was keyed
  differently: a real difference, whatever the tokens), the same token must come from
  the same interval (within `draw_tol`: otherwise the distributions differ, e.g. other
  sampling parameters), and the first differing token must be one whose uniform lies
  within `draw_tol` of its interval's edge, or whose cut is within `draw_tol`, in
  either run. A top-two gap says nothing about where a uniform falls, so it is not used.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

# Tolerances on the top-two logit gap. fp32 logits of the same tokens computed with
# different batch shapes differ by ~1e-5 here; bf16 ones by up to a few 1e-2.
FP32_TOL = 1e-3
BF16_TOL = 0.25
# Tolerances on a draw's distance from a CDF boundary (and on its cut): a logit change
# of d moves the id-ordered CDF's boundaries by at most ~2d/temperature.
DRAW_FP32_TOL = 1e-4
DRAW_BF16_TOL = 0.1

GREEDY_RULE = "top-two gap"
DRAW_RULE = "draws"


@dataclass(frozen=True)
class Comparison:
    same: bool
    diverged_at: int | None  # first differing position, None if identical
    near_tie_at: int | None  # the near-tie (or near-boundary draw) that excuses the divergence
    detail: str
    rule: str = GREEDY_RULE

    def __bool__(self) -> bool:
        return self.same


def _first_difference(a: list, b: list) -> int | None:
    n = min(len(a), len(b))
    diverged = next((i for i in range(n) if a[i] != b[i]), None)
    if diverged is None and len(a) != len(b):
        diverged = n  # one stopped where the other went on
    return diverged


def compare_outputs(a: Sequence[int], b: Sequence[int], margins: Sequence[Sequence[float]] = (),
                    tol: float = FP32_TOL, draws: Sequence[Sequence] = (), draw_tol: float | None = None) -> Comparison:
    """`draws`: the draws of either run or both (sampled tokens); given, the draw rule
    applies, else the top-two gap rule with `margins`."""
    if any(draws):
        if draw_tol is None:
            draw_tol = DRAW_BF16_TOL if tol >= BF16_TOL else DRAW_FP32_TOL
        return _compare_draws(list(a), list(b), [list(d) for d in draws], draw_tol)
    a, b = list(a), list(b)
    diverged = _first_difference(a, b)
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


def _edge(d) -> float:
    """How close a draw was to picking another token: its uniform's distance from its
    interval's edge, or its cut's distance from moving."""
    u, lo, hi, cut = d
    return min(u - lo, hi - u, float("inf") if cut is None else cut)


def _compare_draws(a: list, b: list, draws: list, tol: float) -> Comparison:
    def fail(i, what):
        return Comparison(False, i, None, what, DRAW_RULE)

    diverged = _first_difference(a, b)
    if len(draws) == 2:
        da, db = draws
        for i in range(min(len(da), len(db))):
            if da[i][0] != db[i][0]:
                return fail(i, f"different uniforms at token {i} ({da[i][0]!r} vs {db[i][0]!r}): the draw is keyed "
                               "differently (seed, sequence, operation or position), a real difference")
        same_context = len(a) if diverged is None else diverged
        for i in range(min(same_context, len(da), len(db))):
            if da[i][3] is not None and da[i][3] < tol or db[i][3] is not None and db[i][3] < tol:
                continue  # the kept set may differ here, and with it every interval
            if abs(da[i][1] - db[i][1]) > tol or abs(da[i][2] - db[i][2]) > tol:
                return fail(i, f"token {i} ({a[i]}) came from different intervals ([{da[i][1]:.6f}, {da[i][2]:.6f}) vs "
                               f"[{db[i][1]:.6f}, {db[i][2]:.6f})): the distributions differ, e.g. other sampling parameters")
    if diverged is None:
        return Comparison(True, None, None, "identical, with the same uniforms", DRAW_RULE)
    at = [d[diverged] for d in draws if diverged < len(d)]
    edge = min((_edge(d) for d in at), default=float("inf"))
    if edge < tol:
        return Comparison(True, diverged, diverged, f"parted at {diverged} where the draw was {edge:.2e} from a CDF "
                                                    f"boundary or cut (< {tol}), the same uniform on both sides", DRAW_RULE)
    return fail(diverged, f"differ at token {diverged} ({a[diverged:diverged + 3]} vs {b[diverged:diverged + 3]}) with the "
                          f"draw {edge:.2e} from any CDF boundary or cut (tol {tol})")


def compare_results(x, y, tol: float = FP32_TOL) -> Comparison:
    """Two runs' results (RequestOutputs, GenerateResults or their dicts: token_ids and,
    if recorded, margins and draws), by the rule their recording calls for."""
    def get(r, name):
        return (r.get(name) if isinstance(r, dict) else getattr(r, name, None)) or []

    return compare_outputs(get(x, "token_ids"), get(y, "token_ids"), [get(x, "margins"), get(y, "margins")], tol,
                           draws=[get(x, "draws"), get(y, "draws")])


def compare_generations(a: Sequence[dict], b: Sequence[dict], tol: float = FP32_TOL) -> Comparison:
    """Two runs of a program, by its Generate results in order (dicts with token_ids
    and margins): the same while each pair is identical; a pair that parts after a
    near-tie is the same output, and what follows it (built from different text) is
    not compared."""
    for i, (x, y) in enumerate(zip(a, b)):
        cmp = compare_results(x, y, tol)
        if not cmp:
            return Comparison(False, cmp.diverged_at, None, f"generation {i}: {cmp.detail}", cmp.rule)
        if cmp.diverged_at is not None:
            return Comparison(True, cmp.diverged_at, cmp.near_tie_at, f"generation {i}: {cmp.detail}", cmp.rule)
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
        cmp = compare_results(x, y, tol)
        if not cmp:
            return Comparison(False, i, None, f"hop {i} thought: {cmp.detail}")
        if cmp.diverged_at is not None:
            return Comparison(True, i, i, f"hop {i} thought: {cmp.detail}")
    if len(a["hops"]) != len(b["hops"]):
        return Comparison(False, None, None, f"{len(a['hops'])} hops vs {len(b['hops'])} with the same ones before")
    return Comparison(True, None, None, "identical")
