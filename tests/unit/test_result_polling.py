"""The client reads a job's results at the pace they are stored: once it has read all
that is there, its next read asks storage to wait (`wait_ms`), and against a storage
node that answers at once (older than protocol 1.8) it pauses for that long itself,
even when the last answer carried records.

Each read costs four processes a wake-up (client, router, scheduler, storage). A client
that asked again at once whenever records had come kept them busy for as long as
results trickled in (one or two a step at the end of a generation job), on the cores
the worker computes on: the last 32 steps of W1 through a local cluster took 41% longer
than in-process. A client that slept between reads learned of the job's end up to a
poll interval late (0.2 s of a 15 s W1 job)."""

from __future__ import annotations

import pytest

from shoal.sdk import client as client_module
from shoal.sdk.client import Job

pytestmark = pytest.mark.timeout(10)


class Clock:
    """Stands in for the client module's `time`: sleeping moves the clock."""

    def __init__(self):
        self.now = 0.0
        self.slept: list[float] = []

    def monotonic(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.slept.append(round(s, 6))
        self.now += s


class StoredResults:
    """Answers Subscribe as storage does: the records from `offset` up to what is stored,
    and how many are stored (`available`). `stored(call)` says how many there are at the
    n-th request. With `holds`, a caught-up read is held for its `wait_ms` (storage of
    protocol 1.8; the clock moves), unless the job is complete; without, it is answered
    at once."""

    reply_timeout = 10.0

    def __init__(self, total: int, stored, clock: Clock, holds: bool):
        self.total, self.stored, self.clock, self.holds = total, stored, clock, holds
        self.calls = 0
        self.waits: list[int] = []

    def _request(self, msg_type: str, fields: dict, reply_timeout: float | None = None):
        assert msg_type == "Subscribe"
        assert reply_timeout is not None and reply_timeout > fields["wait_ms"] / 1000
        self.waits.append(fields["wait_ms"])
        available = min(self.total, self.stored(self.calls))
        self.calls += 1
        offset = fields["offset"]
        if self.holds and fields["wait_ms"] and available < self.total:
            self.clock.now += fields["wait_ms"] / 1000
        records = [{"id": i} for i in range(offset, min(available, offset + 4))]  # a page of at most 4
        return {"records": records, "available": available,
                "final": available == self.total and offset + len(records) == available}


@pytest.fixture
def clock(monkeypatch) -> Clock:
    c = Clock()
    monkeypatch.setattr(client_module, "time", c)
    return c


def test_against_storage_that_answers_at_once_a_caught_up_client_pauses(clock):
    # One more result stored at each request: every answer carries a record.
    results = StoredResults(total=6, stored=lambda call: call + 1, clock=clock, holds=False)
    ids = [r["id"] for r in Job(results, "j-1").results(poll=0.2)]
    assert ids == list(range(6))
    # Every answer left the client caught up: it paused after each one but the last.
    assert clock.slept == [0.2] * 5
    assert results.waits == [200] * 6


def test_against_storage_that_holds_reads_the_client_never_sleeps(clock):
    results = StoredResults(total=6, stored=lambda call: call + 1, clock=clock, holds=True)
    ids = [r["id"] for r in Job(results, "j-1").results(poll=0.2)]
    assert ids == list(range(6))
    assert clock.slept == [] and results.waits == [200] * 6
    # The same pace as pausing: one read per wait while the job runs.
    assert clock.now == pytest.approx(1.0)


def test_a_client_behind_the_log_reads_on_without_waiting(clock):
    # All 10 stored from the start, 4 to a page: the first pages are read back to back.
    results = StoredResults(total=10, stored=lambda call: 10, clock=clock, holds=True)
    ids = [r["id"] for r in Job(results, "j-1").results(poll=0.2)]
    assert ids == list(range(10))
    assert results.calls == 3 and clock.slept == []
    # Only the first read (before it knew) asked to wait; storage answered it at once (complete).
    assert results.waits == [200, 0, 0]


def test_wait_lets_each_read_wait_longer_and_still_sees_the_end_at_once(clock):
    # Nothing reads wait()'s results before the end: its reads each wait WAIT_POLL_S, a
    # tenth as many wake-ups of the nodes as results() at its 0.2 s pace.
    results = StoredResults(total=6, stored=lambda call: 2 * call, clock=clock, holds=True)
    records = Job(results, "j-1").wait()
    assert [r["id"] for r in records] == list(range(6))
    assert client_module.WAIT_POLL_S >= 1.0
    assert results.waits == [int(1000 * client_module.WAIT_POLL_S)] * 4
    assert clock.slept == []
    # Three reads held for their whole wait; the fourth found the job complete and was
    # answered at once.
    assert clock.now == pytest.approx(3 * client_module.WAIT_POLL_S)


def test_a_read_waits_no_longer_than_the_timeout_has_left(clock):
    # Nothing is ever stored: wait(timeout=3) with reads of up to 2 s each gives up at
    # 3 s, not at the next whole wait.
    results = StoredResults(total=6, stored=lambda call: 0, clock=clock, holds=True)
    with pytest.raises(TimeoutError):
        Job(results, "j-1").wait(timeout=3.0)
    assert results.waits[:2] == [2000, 1000]
    assert clock.now == pytest.approx(3.0)


def test_catching_up_on_a_page_read_without_waiting_is_no_reason_to_pause(clock):
    # The first read finds 8 stored (4 to a page) and reads on at once; the page that
    # catches up asked for no wait, so the client does not pause before its next read
    # (which waits on storage and finds the job complete) instead of a whole poll.
    stored = [8, 8, 10]
    results = StoredResults(total=10, stored=lambda call: stored[call], clock=clock, holds=True)
    ids = [r["id"] for r in Job(results, "j-1").results(poll=0.2)]
    assert ids == list(range(10))
    assert results.waits == [200, 0, 200]
    assert clock.slept == []
