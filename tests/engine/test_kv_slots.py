"""A sequence's cache slots: the short-span path (a list, for prompts of a few tokens)
gives the tensor path's slots for every span, across block boundaries."""

from __future__ import annotations

import random

import torch

from shoal.nodes.worker.kv_cache import SHORT_SPAN, KVCache


class _Blocks:
    block_size = 16


def _by_tensors(block_table, start, end, bs=16):
    table = torch.tensor(block_table, dtype=torch.long)
    pos = torch.arange(start, end)
    return table[pos // bs] * bs + pos % bs


def test_short_and_long_spans_give_the_same_slots():
    r = random.Random(0)
    for _ in range(300):
        table = r.sample(range(4096), 24)
        start = r.randrange(0, 200)
        end = start + r.choice([1, 2, 15, 16, 17, SHORT_SPAN, SHORT_SPAN + 1, r.randrange(1, 180)])
        got = KVCache.slots_of(_Blocks(), table, start, end)
        assert got.dtype == torch.long and torch.equal(got, _by_tensors(table, start, end)), (start, end)
