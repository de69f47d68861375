"""A job's sequence checkpoints on the storage node: the last recorded state (without
KV) of each unfinished sequence, so that when its worker dies it restarts from there on
another worker instead of from scratch.

An append-only JSONL file per job (`jobs/<id>/checkpoints.jsonl`) with group commit, as
the result log; in memory only the latest state per sequence that has no result yet.
Checkpoints only move forward: one whose progress (operations done, tokens generated
in the current one) is not past the stored one is ignored, so a late or re-sent
checkpoint never winds a sequence back. A torn last line is cut off on open.
"""

from __future__ import annotations

import os
from pathlib import Path

import orjson

from shoal.protocol.coroutine_state import progress


class CheckpointStore:
    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.latest: dict[bytes, dict] = {}  # orjson(seq id) -> state
        self._recover()
        self.fh = None
        self._dirty = False

    def _recover(self) -> None:
        if not self.path.exists():
            return
        data = self.path.read_bytes()
        pos = good = 0
        while (end := data.find(b"\n", pos)) >= 0:
            try:
                entry = orjson.loads(data[pos:end])
                self._keep(orjson.dumps(entry["id"]), entry["state"])
            except (orjson.JSONDecodeError, KeyError, TypeError):
                break
            pos = good = end + 1
        if good < len(data):
            with open(self.path, "r+b") as fh:
                fh.truncate(good)

    def _keep(self, key: bytes, state: dict) -> bool:
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
            if finished(entry["id"]) or not self._keep(orjson.dumps(entry["id"]), entry["state"]):
                continue
            if self.fh is None:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self.fh = open(self.path, "ab")
            self.fh.write(orjson.dumps({"id": entry["id"], "state": entry["state"]}) + b"\n")
            kept += 1
        self._dirty = self._dirty or kept > 0
        return kept

    def get(self, seq_id) -> dict | None:
        return self.latest.get(orjson.dumps(seq_id))

    def forget(self, seq_id) -> None:
        """The sequence has its result: its checkpoint is of no more use."""
        self.latest.pop(orjson.dumps(seq_id), None)

    def commit(self) -> None:
        if self._dirty:
            self.fh.flush()
            os.fsync(self.fh.fileno())
            self._dirty = False

    def close(self) -> None:
        if self.fh is not None:
            self.commit()
            self.fh.close()
