"""SuperBatch packing: bounds, exact coverage, and ids that a restart reproduces."""

from __future__ import annotations

import random

import pytest

from shoal.scheduler.superbatch import pack


def covered(batches) -> dict:
    rows: dict = {}
    for sb in batches:
        for s in sb.slices:
            for r in range(s.start, s.end):
                key = (s.partition, r)
                assert key not in rows, f"row {key} twice"
                rows[key] = sb.id
    return rows


@pytest.mark.parametrize("seed", range(5))
def test_every_row_once_and_no_superbatch_past_its_bound(seed):
    r = random.Random(seed)
    parts = [(f"p{i}", r.choice([0, 1, 3, 50, 700, 5000])) for i in range(40)]
    b_min, n_max = r.choice([(64, 100), (1000, 256), (1, 1), (300, 4096)])
    batches = pack(parts, b_min, n_max)
    assert len(covered(batches)) == sum(n for _, n in parts)
    assert all(sb.size < b_min + n_max for sb in batches)
    assert all(sb.size >= b_min for sb in batches[:-1])  # only the last may fall short
    assert all(s.size <= n_max for sb in batches for s in sb.slices)


def test_small_partitions_are_packed_whole_and_a_large_one_is_split():
    batches = pack([("a", 30), ("b", 30), ("c", 240), ("d", 10)], b_min=50, n_max=100)
    assert [[(s.partition, s.start, s.end) for s in sb.slices] for sb in batches] == [
        [("a", 0, 30), ("b", 0, 30)], [("c", 0, 100)], [("c", 100, 200)], [("c", 200, 240), ("d", 0, 10)]]


def test_a_restart_packs_the_same_superbatches_with_the_same_ids():
    parts = [("x", 120), ("y", 7), ("z", 999)]
    first, again = pack(parts, 100, 64), pack(list(parts), 100, 64)
    assert [sb.id for sb in first] == [sb.id for sb in again]
    assert len({sb.id for sb in first}) == len(first)
    grown = pack([("x", 121), ("y", 7), ("z", 999)], 100, 64)
    assert grown[0].id != first[0].id  # the id is the content


def test_bad_partition_lists_are_refused():
    with pytest.raises(ValueError, match="listed twice"):
        pack([("a", 1), ("a", 2)], 10, 10)
    with pytest.raises(ValueError, match="at least 1"):
        pack([("a", 1)], 0, 10)
    with pytest.raises(ValueError, match="negative size"):
        pack([("a", -1)], 1, 1)



def test_a_gpu_cuts_larger_micro_batches():
    from shoal.scheduler.superbatch import DEFAULT_TOKEN_BUDGET, GPU_TOKEN_BUDGET, default_token_budget, micro_batches

    assert default_token_budget(False) == DEFAULT_TOKEN_BUDGET == 2048 and default_token_budget(True) == GPU_TOKEN_BUDGET
    lengths = [30] * 1000
    assert len(micro_batches(lengths, DEFAULT_TOKEN_BUDGET)) >= 7 * len(micro_batches(lengths, GPU_TOKEN_BUDGET))
