"""Latencies counted in log-spaced buckets (5% wide): bounded memory however many are
recorded, and percentiles of any window from the difference of two snapshots."""

from __future__ import annotations

import bisect
import math

RATIO = 1.05
SMALLEST_S = 1e-5
EDGES = [SMALLEST_S * RATIO ** k for k in range(int(math.log(600 / SMALLEST_S, RATIO)) + 2)]  # up to 10 minutes


class LatencyHistogram:
    def __init__(self):
        self.counts = [0] * (len(EDGES) + 1)

    def add(self, seconds: float) -> None:
        self.counts[bisect.bisect_left(EDGES, seconds)] += 1

    def snapshot(self) -> list[int]:
        return list(self.counts)


def percentile(counts: list[int], q: float) -> float | None:
    """The q-th percentile (0-100) in seconds: the upper edge of the bucket it falls in
    (so never understated, at most 5% over). None for no samples."""
    total = sum(counts)
    if total == 0:
        return None
    rank = math.ceil(q / 100 * total)
    seen = 0
    for i, c in enumerate(counts):
        seen += c
        if seen >= max(rank, 1):
            return EDGES[min(i, len(EDGES) - 1)]
    return EDGES[-1]


def window(before: list[int], after: list[int]) -> list[int]:
    """The counts recorded between two snapshots."""
    return [a - b for a, b in zip(after, before)]
