"""The storage node's waiting reads: held per job, taken when ready or due, bounded."""

from __future__ import annotations

import pytest

from shoal.nodes.storage import parked_reads
from shoal.nodes.storage.parked_reads import ParkedRead, ParkedReads

pytestmark = pytest.mark.timeout(10)


def test_reads_are_taken_when_ready_or_due_and_the_rest_stay():
    p = ParkedReads()
    a, b, c = ParkedRead("a", deadline=5.0), ParkedRead("b", deadline=2.0), ParkedRead("c", deadline=9.0)
    p.park("j1", a)
    p.park("j1", b)
    p.park("j2", c)
    assert p.count == 3 and p.next_deadline() == 2.0
    assert p.take("j1", lambda r: r.msg == "a") == [a]
    assert p.jobs() == ["j1", "j2"] and p.count == 2
    assert p.take_due(now=3.0) == [("j1", b)]
    assert p.jobs() == ["j2"] and p.next_deadline() == 9.0
    assert p.take_due(now=8.0) == [] and p.take("j3", lambda r: True) == []
    assert p.take("j2", lambda r: True) == [c]
    assert p.count == 0 and p.jobs() == [] and p.next_deadline() is None


def test_the_number_of_waiting_reads_is_bounded(monkeypatch):
    monkeypatch.setattr(parked_reads, "MAX_PARKED", 2)
    p = ParkedReads()
    p.park("j", ParkedRead("a", 1.0))
    assert not p.full()
    p.park("j", ParkedRead("b", 1.0))
    assert p.full()
