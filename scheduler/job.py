"""A job as the scheduler sees it: where each of its sequences is, nothing more.

Its items stay on storage; the scheduler holds only those read and on no worker
(`pending`) and which worker holds which (`placed`). Times are the scheduler core's
clock values, never read here: the same table runs on a wall clock in the node and on
a virtual one in the simulator.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from shoal.scheduler.placed_table import PlacedTable

EMBED = "embed"  # the program name of bulk embedding jobs: SuperBatches, not sequences


@dataclass
class Job:
    job_id: str
    job_key: str
    program: str
    params: dict  # the program's arguments (for `generate`: sampling parameters)
    total: int
    storage: str  # the storage node's address: inputs, results, the job log
    state: str = "running"
    cursor: int = 0  # next input position to read (pending items only)
    reading: bool = False  # a ReadInput from the cursor is out; its page not yet in
    planned: bool = False  # an embedding job: its SuperBatch plan and done ids are read
    # Units of work read but on no worker: a generation job's sequence assignments, an
    # embedding job's SuperBatches (`unit_id` names either).
    pending: deque = field(default_factory=deque)
    pending_ids: set = field(default_factory=set)
    placed: PlacedTable = field(default_factory=PlacedTable)  # unit id -> worker id, counted per worker
    done: int = 0  # results stored (storage's count at takeover + reports since)
    tokens: int = 0
    started: float = 0.0
    finished_at: float | None = None
    detail: dict = field(default_factory=dict)  # what ingest found (an embedding job's bad rows, ...)
    superbatches: dict | None = None  # an embedding job's: id -> {id, slices, size}, once planned

    @property
    def embedding(self) -> bool:
        return self.program == EMBED

    @property
    def running(self) -> bool:
        return self.state == "running"

    @property
    def fully_read(self) -> bool:
        """Everything there is to place is known: a generation job's input read to its
        end, an embedding job's SuperBatch plan read."""
        return self.planned if self.embedding else self.cursor >= self.total

    def weight(self, sid) -> int:
        """What finishing `sid` adds to `done`: a sequence counts 1, a SuperBatch its texts."""
        if not self.embedding:
            return 1
        return (self.superbatches or {}).get(sid, {}).get("size", 0)

    def record(self) -> dict:
        return {"job_id": self.job_id, "job_key": self.job_key, "program": self.program, "params": self.params,
                "total": self.total, "state": self.state, "detail": self.detail}

    def status(self, now: float) -> dict:
        elapsed = (self.finished_at if self.finished_at is not None else now) - self.started
        return {"job_id": self.job_id, "state": self.state, "total": self.total, "done": self.done,
                "tokens_per_s": self.tokens / max(elapsed, 1e-9), "detail": self.detail}

    def add_pending(self, unit: dict) -> None:
        sid = unit_id(unit)
        if sid not in self.placed and sid not in self.pending_ids:
            self.pending.append(unit)
            self.pending_ids.add(sid)

    def drop_pending(self, sid) -> bool:
        if sid not in self.pending_ids:
            return False
        self.pending_ids.discard(sid)
        self.pending = deque(u for u in self.pending if unit_id(u) != sid)
        return True

    def rescan(self) -> None:
        """Read the input again from the start (only items without results come back):
        after a takeover or a lost worker, whatever nobody holds is found again. A read
        still out answers for the old cursor: its page is ignored."""
        self.cursor = 0
        self.reading = False
        self.planned = False


def unit_id(unit: dict):
    """A unit of work's id: a sequence assignment carries it as `seq_id` (its name on
    the wire), a SuperBatch as `id` (likewise)."""
    return unit["seq_id"] if "seq_id" in unit else unit["id"]


def assignment(item: dict, state: dict | None = None) -> dict:
    """What a worker gets for one item: the item as it is (the job's program reads its
    fields there), with its last checkpoint when it is placed again, to restart there."""
    a = {"seq_id": item["id"], "item": item}
    if state:
        a["state"] = state
    return a
