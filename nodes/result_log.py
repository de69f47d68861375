"""A job's result log on the storage node's disk: an append-only JSONL write-ahead log.

First writer wins per item id: a record whose id is already in the log is counted as a
duplicate and dropped, so at-least-once delivery never shows an item twice. Appends are
buffered and made durable by `commit()` (one fsync for however many records arrived
since the last one: group commit). On open, a torn last line from a crash mid-write is
cut off; every record before it is intact.
"""

from __future__ import annotations

import os
from pathlib import Path

import orjson


class ResultLog:
    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.offsets: list[int] = []  # byte offset of each record, in log order
        self.ids: set[bytes] = set()
        self.failed = 0  # records whose finish_reason is "error"
        self._recover()
        self.fh = open(self.path, "ab")
        self._dirty = False

    def _recover(self) -> None:
        if not self.path.exists():
            return
        good = 0
        with open(self.path, "rb") as fh:
            data = fh.read()
        pos = 0
        while pos < len(data):
            end = data.find(b"\n", pos)
            if end < 0:
                break  # torn tail: no newline
            try:
                rec = orjson.loads(data[pos:end])
                key = orjson.dumps(rec["id"])
            except (orjson.JSONDecodeError, KeyError, TypeError):
                break
            self.offsets.append(pos)
            self.ids.add(key)
            self.failed += rec.get("finish_reason") == "error"
            pos = good = end + 1
        if good < len(data):
            with open(self.path, "r+b") as fh:
                fh.truncate(good)

    def __len__(self) -> int:
        return len(self.offsets)

    def __contains__(self, item_id) -> bool:
        """Whether the item with this id has its result here."""
        return orjson.dumps(item_id) in self.ids

    def append(self, records: list[dict]) -> tuple[int, int]:
        """Buffers new records; returns (written, duplicates). Durable after commit()."""
        written = dup = 0
        for rec in records:
            key = orjson.dumps(rec["id"])
            if key in self.ids:
                dup += 1
                continue
            line = orjson.dumps(rec) + b"\n"
            self.offsets.append(self.fh.tell())
            self.fh.write(line)
            self.ids.add(key)
            self.failed += rec.get("finish_reason") == "error"
            written += 1
        self._dirty = self._dirty or written > 0
        return written, dup

    def commit(self) -> None:
        if self._dirty:
            self.fh.flush()
            os.fsync(self.fh.fileno())
            self._dirty = False

    def read(self, offset: int, limit: int, max_bytes: int | None = None) -> list[dict]:
        """Committed-or-buffered records [offset, offset + limit) in log order; fewer
        if their lines pass `max_bytes` (at least one)."""
        self.fh.flush()
        out, size = [], 0
        with open(self.path, "rb") as fh:
            for start in self.offsets[offset : offset + limit]:
                fh.seek(start)
                line = fh.readline()
                size += len(line)
                if out and max_bytes is not None and size > max_bytes:
                    break
                out.append(orjson.loads(line))
        return out

    def close(self) -> None:
        self.commit()
        self.fh.close()
