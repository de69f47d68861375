"""The row counts a padded step is computed at (`models/row_buckets.py`): few of them,
never fewer rows than asked, and little more."""

from __future__ import annotations

import pytest

from shoal.nodes.worker.models.row_buckets import padded_rows

pytestmark = pytest.mark.timeout(10)


def test_decode_sized_steps_round_up_to_a_tile_of_16_rows():
    assert [padded_rows(r) for r in (1, 15, 16, 17, 113, 128, 129, 256)] == [16, 16, 16, 32, 128, 128, 144, 256]


def test_larger_steps_get_at_most_a_sixteenth_more_rows():
    for r in range(257, 16_385):
        p = padded_rows(r)
        assert r <= p <= r + r / 16, (r, p)
    assert padded_rows(4096) == 4096 and padded_rows(2048) == 2048  # a full budget is not padded


def test_few_sizes_cover_every_step_a_budget_allows():
    sizes = {padded_rows(r) for r in range(1, 8193)}
    assert len(sizes) == 96
    assert all(padded_rows(s) == s for s in sizes)  # a size is its own bucket
