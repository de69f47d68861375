"""Result reads that wait: a `Subscribe` with `wait_ms` that finds nothing worth sending
yet is held here until its job has something to say or its wait is over.

Why: a client that has read all there is would otherwise ask again on a timer, and
learn that its job is complete only at its next poll (0-200 ms late, on every job,
and one more wake-up of router, scheduler and storage each time). Held here, its read
is answered as soon as every item's result is stored. Partial results are still sent
once per wait rather than as each one is stored: answering every commit would wake
the client, router, scheduler and storage once per engine step while results trickle
in at the end of a generation job, on the cores the worker computes on.

Pure bookkeeping, no sockets: the storage node decides when a job is ready and sends
the answers.
"""

from __future__ import annotations

from dataclasses import dataclass, field

MAX_WAIT_S = 10.0  # a read is held at most this long, whatever it asked
MAX_PARKED = 4096  # beyond this many waiting reads, a new one is answered at once


@dataclass
class ParkedRead:
    """A `Subscribe` to answer later; `identity` is set by the loop that parks it."""

    msg: object  # the request (a codec Message)
    deadline: float  # time.monotonic() by which it is answered
    identity: bytes = b""


@dataclass
class ParkedReads:
    by_job: dict[str, list[ParkedRead]] = field(default_factory=dict)
    count: int = 0

    def full(self) -> bool:
        return self.count >= MAX_PARKED

    def park(self, job_id: str, read: ParkedRead) -> None:
        self.by_job.setdefault(job_id, []).append(read)
        self.count += 1

    def jobs(self) -> list[str]:
        return list(self.by_job)

    def take(self, job_id: str, ready) -> list[ParkedRead]:
        """Removes and returns the job's reads for which `ready(read)` holds."""
        taken, kept = [], []
        for r in self.by_job.get(job_id, []):
            (taken if ready(r) else kept).append(r)
        if taken:
            self._set(job_id, kept)
            self.count -= len(taken)
        return taken

    def take_due(self, now: float) -> list[tuple[str, ParkedRead]]:
        """Removes and returns every read whose wait is over."""
        due = []
        for job_id in self.jobs():
            due += [(job_id, r) for r in self.take(job_id, lambda r: r.deadline <= now)]
        return due

    def next_deadline(self) -> float | None:
        return min((r.deadline for reads in self.by_job.values() for r in reads), default=None)

    def _set(self, job_id: str, reads: list[ParkedRead]) -> None:
        if reads:
            self.by_job[job_id] = reads
        else:
            del self.by_job[job_id]
