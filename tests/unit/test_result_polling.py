"""The client reads a job's results at the pace they are stored: once it has read all
that is there, it waits before asking again, even when the last answer carried records.

Each poll costs four processes a wake-up (client, router, scheduler, storage). A client
that asked again at once whenever records had come kept them busy for as long as
results trickled in (one or two a step at the end of a generation job), on the cores
the worker computes on: the last 32 steps of W1 through a local cluster took 41% longer
than in-process."""

from __future__ import annotations

import pytest

from shoal import client as client_module
from shoal.client import Job

pytestmark = pytest.mark.timeout(10)


class StoredResults:
    """Answers Subscribe as storage does: the records from `offset` up to what is stored,
    and how many are stored (`available`). `stored(call)` says how many there are at the
    n-th request."""

    def __init__(self, total: int, stored):
        self.total, self.stored = total, stored
        self.calls = 0

    def _request(self, msg_type: str, fields: dict):
        assert msg_type == "Subscribe"
        available = min(self.total, self.stored(self.calls))
        self.calls += 1
        offset = fields["offset"]
        records = [{"id": i} for i in range(offset, min(available, offset + 4))]  # a page of at most 4
        return {"records": records, "available": available,
                "final": available == self.total and offset + len(records) == available}


@pytest.fixture
def sleeps(monkeypatch) -> list:
    slept: list = []
    monkeypatch.setattr(client_module.time, "sleep", slept.append)
    return slept


def test_a_client_that_has_caught_up_waits_before_asking_again(sleeps):
    # One more result stored at each request: every answer carries a record.
    results = StoredResults(total=6, stored=lambda call: call + 1)
    ids = [r["id"] for r in Job(results, "j-1").results(poll=0.2)]
    assert ids == list(range(6))
    # Every answer left the client caught up: it waited after each one but the last.
    assert sleeps == [0.2] * 5


def test_a_client_behind_the_log_reads_on_without_waiting(sleeps):
    # All 10 stored from the start, 4 to a page: the first pages are read back to back.
    results = StoredResults(total=10, stored=lambda call: 10)
    ids = [r["id"] for r in Job(results, "j-1").results(poll=0.2)]
    assert ids == list(range(10))
    assert results.calls == 3 and sleeps == []
