"""The scheduler's job table, logged durably on the storage node: the control plane's
memory across scheduler deaths.

One JSONL file (`append_log.py`) of job records `{"job_id", "job_key", "program", "params", "total",
"state", "epoch"}`; the latest record of a job is its state, and a job's state only
moves forward (running -> done | cancelled), so a re-sent or stale record cannot undo a
newer one. The log also keeps the largest leader epoch it has seen: a record or a
listing from an older epoch is refused, which fences off a frozen old leader. Progress
is not logged here: a job's finished items are its result log, and where its other
items run is what the workers report they hold.
"""

from __future__ import annotations

from pathlib import Path

from shoal.nodes.storage.append_log import AppendLog
from shoal.protocol.errors import ShoalError

_RANK = {"running": 0, "done": 1, "cancelled": 1}
REQUIRED = ("job_id", "job_key", "program", "params", "total", "state")


class StaleEpoch(ShoalError, ValueError):
    """A command from a leader older than one this log has already seen."""


class JobLog:
    def __init__(self, path: str | Path):
        self.jobs: dict[str, dict] = {}
        self.epoch = 0
        # Each record is committed as it is written (a job's state change is rare).
        self.log = AppendLog(path, self._recovered)

    def _recovered(self, _offset: int, rec: dict) -> None:
        if "job_id" in rec:
            self._apply(rec)
        self.epoch = max(self.epoch, int(rec.get("epoch", 0)))

    def check_epoch(self, epoch: int) -> None:
        """Accepts commands from this epoch on; refuses older ones."""
        if epoch < self.epoch:
            raise StaleEpoch(f"epoch {epoch} is older than the current leader's epoch {self.epoch}")
        if epoch > self.epoch:
            self.epoch = epoch
            self._write({"epoch": epoch})

    def _newer(self, rec: dict) -> bool:
        old = self.jobs.get(rec["job_id"])
        return old is None or _RANK.get(rec["state"], 0) >= _RANK.get(old["state"], 0)

    def _apply(self, rec: dict) -> None:
        if self._newer(rec):
            self.jobs[rec["job_id"]] = rec

    def record(self, rec: dict, epoch: int) -> None:
        missing = [k for k in REQUIRED if k not in rec]
        if missing:
            raise ValueError(f"job record lacks {missing[0]!r}")
        if rec["state"] not in _RANK:
            raise ValueError(f"job state {rec['state']!r} is not one of {', '.join(_RANK)}")
        self.check_epoch(epoch)
        rec = {**rec, "epoch": epoch}
        if self._newer(rec):  # on disk first: a record the disk refuses is not known here either
            self._write(rec)
            self.jobs[rec["job_id"]] = rec

    def _write(self, rec: dict) -> None:
        self.log.append(rec)
        self.log.commit()

    def close(self) -> None:
        self.log.close()
