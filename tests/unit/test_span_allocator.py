"""The host KV pool's bookkeeping: first fit, freed spans merged, double frees refused."""

from __future__ import annotations

import random

import pytest

from shoal.nodes.worker.span_allocator import SpanAllocator


def test_first_fit_and_merging():
    a = SpanAllocator(100)
    x, y, z = a.allocate(30), a.allocate(30), a.allocate(30)
    assert (x, y, z) == (0, 30, 60) and a.used == 90
    assert a.allocate(11) is None  # 10 left
    a.release(y, 30)
    assert a.allocate(31) is None and a.allocate(30) == 30  # the hole is reused
    a.release(x, 30)
    a.release(30, 30)  # merges with the span before it...
    a.release(z, 30)  # ...and this with both neighbours: one free span again
    assert a.free == [(0, 100)] and a.used == 0
    with pytest.raises(ValueError, match="released twice"):
        a.release(10, 5)


def test_random_traffic_never_overlaps_and_frees_everything():
    r = random.Random(0)
    a, live = SpanAllocator(1000), {}
    for _ in range(2000):
        if live and r.random() < 0.5:
            start = r.choice(list(live))
            a.release(start, live.pop(start))
        else:
            n = r.randint(1, 80)
            start = a.allocate(n)
            if start is not None:
                assert all(start + n <= s or s + m <= start for s, m in live.items()), "spans overlap"
                live[start] = n
        assert a.used == sum(live.values())
    for start, n in live.items():
        a.release(start, n)
    assert a.free == [(0, 1000)]
