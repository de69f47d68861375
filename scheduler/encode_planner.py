"""Heterogeneous steps: how much encoder work runs beside the engine's next step.

Pure. A worker's loop turn runs one engine step (prefill and decode chunks, planned by
the step planner) and then encoder micro-batches for the texts queued by Embed
operations and Retrieve queries. Encoding everything at once is the cheapest per text
(fewer, fuller micro-batches) and unblocks the most sequences, but a large backlog
would stall every decoding sequence for its whole duration. So the encoder gets the
predicted time of the engine's step (prefill and decode terms of `CostModel`) times
`share`, spent on the oldest texts first under its own terms (a per micro-batch, c per
padded token: `EncoderCost`), and always at least one text so that it progresses. With
the engine idle, or no calibration to predict with, everything queued runs.

A few short texts (the queries of a few sequences) cost mostly the micro-batch
overhead `a`: while the engine has other work, they wait until enough have queued to
amortize it (`a` at most the rest of the call) or the oldest has waited
`max_defer_steps` steps, whichever comes first.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from shoal.scheduler.embed_prediction import EncoderCost

DEFAULT_SHARE = 1.0  # a loop turn at most about doubles while a backlog drains
MAX_DEFER_STEPS = 4


def amortizing_batch(lengths: Sequence[int], cost: EncoderCost) -> int:
    """Texts of these lengths for which the micro-batch overhead is at most the rest."""
    per_text = cost.c * max(1.0, sum(lengths) / max(1, len(lengths)))
    return max(1, math.ceil(cost.a / per_text))


def plan_encode(lengths: Sequence[int], engine_step_s: float, cost: EncoderCost | None, token_budget: int,
                oldest_wait_steps: int = 0, share: float = DEFAULT_SHARE, max_defer_steps: int = MAX_DEFER_STEPS) -> int:
    """How many of the queued texts (token lengths, oldest first) to encode now."""
    n = len(lengths)
    if n == 0 or engine_step_s <= 0 or cost is None:
        return n
    batch = amortizing_batch(lengths, cost)
    if n < batch and oldest_wait_steps < max_defer_steps:
        return 0  # too few to be worth a call yet, and the engine has other work
    least = min(n, batch)
    allowance = share * engine_step_s
    if cost.encode(list(lengths), token_budget) <= allowance:
        return n
    lo, hi = least, n - 1  # the largest prefix that fits; at least an amortizing batch
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if cost.encode(list(lengths[:mid]), token_budget) <= allowance:
            lo = mid
        else:
            hi = mid - 1
    return lo
