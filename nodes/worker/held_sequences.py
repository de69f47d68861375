"""The sequences a worker holds, by job: assigned or imported, until their results are
stored or they have moved to another worker. What a new leader is told after a
takeover, and how a re-sent assignment or import is recognised and taken once.

The IO thread adds, the result writer and the mover remove, the watchdog asks whether
anything is left: every method takes the one lock.
"""

from __future__ import annotations

import threading


class HeldSequences:
    def __init__(self):
        self._lock = threading.Lock()
        self._ids: dict[str, set] = {}  # job_id -> seq ids

    def take(self, job_id: str, seqs: list[dict]) -> list[dict]:
        """Adds the sequences not held yet; returns those (a re-sent one is not new)."""
        with self._lock:
            held = self._ids.setdefault(job_id, set())
            fresh = [s for s in seqs if s["seq_id"] not in held]
            held.update(s["seq_id"] for s in fresh)
            return fresh

    def holds(self, job_id: str, seq_id) -> bool:
        with self._lock:
            return seq_id in self._ids.get(job_id, ())

    def release(self, job_id: str, seq_ids) -> None:
        """Stored or moved: no longer held here."""
        with self._lock:
            self._ids.get(job_id, set()).difference_update(seq_ids)

    def by_job(self) -> dict[str, list]:
        """job_id -> the ids held, sorted; jobs holding none left out."""
        with self._lock:
            return {job_id: sorted(ids, key=str) for job_id, ids in self._ids.items() if ids}

    def any(self) -> bool:
        with self._lock:
            return any(self._ids.values())

    def clear(self) -> None:
        with self._lock:
            self._ids.clear()

    def keep_only(self, kept: dict[str, set]) -> int:
        """Lets go of every id not in `kept` (job_id -> ids); returns how many stay."""
        with self._lock:
            for job_id in list(self._ids):
                self._ids[job_id] &= kept.get(job_id, set())
                if not self._ids[job_id]:
                    del self._ids[job_id]
            return sum(len(ids) for ids in self._ids.values())
