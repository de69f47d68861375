"""A job's result log on the storage node's disk: an append-only JSONL write-ahead log
(`append_log.py`: group commit, a torn tail cut off on open).

First writer wins per item id: a record whose id is already in the log is counted as a
duplicate and dropped, so at-least-once delivery never shows an item twice.

Readers see committed records only (`len` counts them): a record is read, and counted
toward the job, once it is durable, so one a full disk rolls back was never shown.
"""

from __future__ import annotations

from pathlib import Path

import orjson

from shoal.nodes.storage.append_log import AppendLog


def parse_within(lines, max_bytes: int | None) -> list[dict]:
    """The records of `lines` while their bytes stay within `max_bytes` (at least one)."""
    out, size = [], 0
    for line in lines:
        size += len(line)
        if out and max_bytes is not None and size > max_bytes:
            break
        out.append(orjson.loads(line))
    return out


class ResultLog:
    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.offsets: list[int] = []  # byte offset of each record, in log order
        self.ids: set[bytes] = set()
        self.failed = 0  # committed records whose finish_reason is "error"
        self._pending: list[tuple[bytes, bool]] = []  # (id, failed) of records appended since the last commit
        self.log = AppendLog(self.path, self._recovered)
        self.durable = len(self.offsets)

    def _recovered(self, offset: int, rec: dict) -> None:
        key = orjson.dumps(rec["id"])
        self.offsets.append(offset)
        self.ids.add(key)
        self.failed += rec.get("finish_reason") == "error"

    def __len__(self) -> int:
        return self.durable

    def __contains__(self, item_id) -> bool:
        """Whether the item with this id has its result here (or in the commit under way)."""
        return orjson.dumps(item_id) in self.ids

    def append(self, records: list[dict]) -> tuple[int, int]:
        """Buffers new records; returns (written, duplicates). Durable after commit()."""
        written = dup = 0
        for rec in records:
            key = orjson.dumps(rec["id"])
            if key in self.ids:
                dup += 1
                continue
            self.offsets.append(self.log.append(rec))
            self.ids.add(key)
            self._pending.append((key, rec.get("finish_reason") == "error"))
            written += 1
        return written, dup

    def commit(self) -> None:
        """Makes the records appended since the last commit durable and readable. If the
        disk refuses them they are forgotten here too (their ids free for the re-sent
        copies) and the error is raised."""
        if not self._pending:
            return
        try:
            self.log.commit()
        except OSError:
            for key, _ in self._pending:
                self.ids.discard(key)
            del self.offsets[self.durable:]
            self._pending.clear()
            raise
        self.failed += sum(f for _, f in self._pending)
        self._pending.clear()
        self.durable = len(self.offsets)

    def read(self, offset: int, limit: int, max_bytes: int | None = None) -> list[dict]:
        """Committed records [offset, offset + limit) in log order; fewer if their lines
        pass `max_bytes` (at least one)."""
        with open(self.path, "rb") as fh:
            def lines():
                for start in self.offsets[offset : min(offset + limit, self.durable)]:
                    fh.seek(start)
                    yield fh.readline()

            return parse_within(lines(), max_bytes)

    def close(self) -> None:
        self.log.close()
