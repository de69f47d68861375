"""A job's sequence checkpoints on the storage node: the last recorded state (without
KV) of each unfinished sequence, so that when its worker dies it restarts from there on
another worker instead of from scratch.

An append-only JSONL file per job (`jobs/<id>/checkpoints.jsonl`, `append_log.py`: group
commit, a torn tail cut off on open); in memory only the latest state per sequence that has no result yet.
Checkpoints only move forward: one whose progress (operations done, tokens generated
in the current one) is not past the stored one is ignored, so a late or re-sent
checkpoint never winds a sequence back. A torn last line is cut off on open.
"""

from __future__ import annotations

from pathlib import Path


from shoal.nodes.storage.append_log import AppendLog
from shoal.seen_ids import item_key
from shoal.protocol.coroutine_state import progress


class CheckpointStore:
    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.latest: dict = {}  # item_key(seq id) -> state
        # The file appears with the first checkpoint: a job read but never checkpointed leaves none.
        self.log = AppendLog(self.path, lambda _, entry: self._keep(item_key(entry["id"]), entry["state"]),
                             create=False)

    def _keep(self, key, state: dict) -> bool:
        old = self.latest.get(key)
        if old is not None and progress(state) <= progress(old):
            return False
        self.latest[key] = state
        return True

    def record(self, entries: list[dict], finished) -> int:
        """Buffers checkpoints `{"id", "state"}`; those of sequences `finished` (a
        predicate on the id) or not ahead of the stored one are dropped. Returns how
        many were kept. Durable after commit()."""
        kept = 0
        for entry in entries:
            if finished(entry["id"]) or not self._keep(item_key(entry["id"]), entry["state"]):
                continue
            self.log.append({"id": entry["id"], "state": entry["state"]})
            kept += 1
        return kept

    def get(self, seq_id) -> dict | None:
        return self.latest.get(item_key(seq_id))

    def forget(self, seq_id) -> None:
        """The sequence has its result: its checkpoint is of no more use."""
        self.latest.pop(item_key(seq_id), None)

    def commit(self) -> None:
        """Durable on disk. A full disk drops the appended lines (the error is raised)
        but not the states kept in memory: each is a valid point to restart from, only
        not one a crash of this node would keep."""
        self.log.commit()

    def close(self) -> None:
        self.log.close()
