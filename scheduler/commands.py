"""What the scheduler core asks its shell to do.

The core (`scheduler/core.py`) never sends anything: each call returns a list of these,
and the shell — the scheduler node over ZeroMQ, or the cluster simulator in memory —
carries them out and reports what came back as the next event. Commands name workers
by node id; the shell knows their addresses.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ReadInput:
    """Read a page of the job's unfinished items from `offset`; answer with
    `core.input_read`."""

    job_id: str
    offset: int
    limit: int


@dataclass(frozen=True)
class ReadSuperBatchPlan:
    """Read the embedding job's partition list (when `partitions`) and the ids its output
    holds; answer with `core.superbatch_state`."""

    job_id: str
    partitions: bool


@dataclass(frozen=True)
class AssignSequences:
    """Give the worker these sequences (their items and checkpoints). On failure answer
    `core.assign_failed`: they go back to pending."""

    worker: str
    job_id: str
    assignments: tuple


@dataclass(frozen=True)
class AssignSuperBatches:
    """Give the worker these SuperBatches to embed. On failure: `core.assign_failed`."""

    worker: str
    job_id: str
    superbatches: tuple


@dataclass(frozen=True)
class MigrateSequences:
    """Ask `source` to move `count` of the job's sequences (it picks which) or the listed
    ones to `target`. The worker reports the move with its next progress report."""

    source: str
    target: str
    job_id: str
    count: int | None = None
    seq_ids: tuple | None = None


@dataclass(frozen=True)
class DropJob:
    """Tell the worker a job is cancelled: it stops the job's sequences it holds. Best
    effort: where the message is lost, they run to their end, as before a cancel."""

    worker: str
    job_id: str


@dataclass(frozen=True)
class CountResults:
    """Count the job's stored results; answer with `core.results_counted`."""

    job_id: str


@dataclass(frozen=True)
class LogJob:
    """Write the job's record to its log (its state changed: finished)."""

    job_id: str
    record: dict
