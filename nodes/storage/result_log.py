"""A job's result log on the storage node's disk: an append-only JSONL write-ahead log
(`append_log.py`: group commit, a torn tail cut off on open).

First writer wins per item id: a record whose id is already in the log is counted as a
duplicate and dropped, so at-least-once delivery never shows an item twice.
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
        self.failed = 0  # records whose finish_reason is "error"
        self.log = AppendLog(self.path, self._recovered)

    def _recovered(self, offset: int, rec: dict) -> None:
        key = orjson.dumps(rec["id"])
        self.offsets.append(offset)
        self.ids.add(key)
        self.failed += rec.get("finish_reason") == "error"

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
            self.offsets.append(self.log.append(rec))
            self.ids.add(key)
            self.failed += rec.get("finish_reason") == "error"
            written += 1
        return written, dup

    def commit(self) -> None:
        self.log.commit()

    def read(self, offset: int, limit: int, max_bytes: int | None = None) -> list[dict]:
        """Committed-or-buffered records [offset, offset + limit) in log order; fewer
        if their lines pass `max_bytes` (at least one)."""
        self.log.flush()
        with open(self.path, "rb") as fh:
            def lines():
                for start in self.offsets[offset : offset + limit]:
                    fh.seek(start)
                    yield fh.readline()

            return parse_within(lines(), max_bytes)

    def close(self) -> None:
        self.log.close()
