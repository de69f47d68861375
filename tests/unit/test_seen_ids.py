"""SeenIds: the ids a job's input check and a running result log keep, in a bitmap where
ids are numbered, with their first place; a dict for everything else."""

from __future__ import annotations

import random

from shoal.seen_ids import SeenIds


def test_numbered_ids_cost_bits_and_keep_their_places():
    seen = SeenIds()
    for line, i in enumerate(range(100_000), 1):
        assert seen.add(i, line)
    assert len(seen) == 100_000 and not seen.others and len(seen.bits) <= 2 * 100_000 // 8 + (64 << 10)
    assert not seen.add(500, 7) and seen.place(500) == 501  # a repeat is refused; the first place stands
    assert 99_999 in seen and 100_000 not in seen and "5" not in seen


def test_every_other_kind_of_id_is_kept_exactly():
    """Strings, negative and far-off numbers, ids off the numbering, 1 beside "1": all
    against a plain dict."""
    r = random.Random(3)
    seen, ref = SeenIds(), {}
    ids = [*range(50), "1", "a", -3, 10**12, *(r.randrange(10**6) for _ in range(200)), *(f"s{k}" for k in range(30)), 7]
    for place, i in enumerate(ids, 1):
        assert seen.add(i, place) == (i not in ref)
        ref.setdefault(i, place)
    assert len(seen) == len(ref)
    for i, place in ref.items():
        assert i in seen and seen.place(i) == place, i
    assert seen.place(1) == 2 and seen.place("1") == 51
    for i in list(ref)[::3]:
        seen.discard(i)
        del ref[i]
    assert len(seen) == len(ref) and all(i in seen for i in ref)
    assert all(i not in seen for i in ids if i not in ref)


def test_a_set_without_places_takes_ids_in_any_order_as_bits():
    seen = SeenIds()
    order = list(range(10_000))
    random.Random(1).shuffle(order)
    for i in order:
        seen.add(i)
    assert len(seen) == 10_000 and not seen.others
