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
from shoal.seen_ids import SeenIds


STRIDE = 1024  # one byte offset kept per this many records: a read seeks to the nearest and skips the rest


def parse_within(lines, max_bytes: int | None) -> list[dict]:
    """The records of `lines` while their bytes stay within `max_bytes` (at least one)."""
    out, size = [], 0
    for line in lines:
        size += len(line)
        if out and max_bytes is not None and size > max_bytes:
            break
        out.append(orjson.loads(line))
    return out


def read_sparse(path: Path, sparse: list[int], count: int, offset: int, limit: int,
                max_bytes: int | None) -> list[dict]:
    """Records [offset, offset + limit) of the first `count` in the log at `path`, whose
    `sparse` offsets are those of records 0, STRIDE, 2 * STRIDE, ...; fewer if their
    lines pass `max_bytes` (at least one)."""
    if offset >= count or limit <= 0:
        return []
    with open(path, "rb") as fh:
        fh.seek(sparse[offset // STRIDE])
        for _ in range(offset % STRIDE):
            fh.readline()
        return parse_within((fh.readline() for _ in range(min(limit, count - offset))), max_bytes)


class ResultLog:
    def __init__(self, path: str | Path):
        self.path = Path(path)
        # What a running job keeps per item is a bit (`seen_ids.py`, for ids numbered
        # 0, 1, 2, ...): the byte offset of every STRIDE-th record and the ids with a result.
        self.sparse: list[int] = []
        self.ids = SeenIds()
        self.count = 0  # records appended, committed or not
        self.failed = 0  # committed records whose finish_reason is "error"
        self._pending: list[tuple] = []  # (id, failed) of records appended since the last commit
        self.log = AppendLog(self.path, self._recovered)
        self.durable = self.count

    def _recovered(self, offset: int, rec: dict) -> None:
        self._add(offset, rec["id"])
        self.failed += rec.get("finish_reason") == "error"

    def _add(self, offset: int, item_id) -> None:
        if self.count % STRIDE == 0:
            self.sparse.append(offset)
        self.count += 1
        self.ids.add(item_id)

    def __len__(self) -> int:
        return self.durable

    def __contains__(self, item_id) -> bool:
        """Whether the item with this id has its result here (or in the commit under way)."""
        return item_id in self.ids

    def append(self, records: list[dict]) -> tuple[int, int]:
        """Buffers new records; returns (written, duplicates). Durable after commit()."""
        written = dup = 0
        for rec in records:
            if rec["id"] in self.ids:
                dup += 1
                continue
            self._add(self.log.append(rec), rec["id"])
            self._pending.append((rec["id"], rec.get("finish_reason") == "error"))
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
            for item_id, _ in self._pending:
                self.ids.discard(item_id)
            self.count = self.durable
            del self.sparse[(self.durable + STRIDE - 1) // STRIDE:]
            self._pending.clear()
            raise
        self.failed += sum(f for _, f in self._pending)
        self._pending.clear()
        self.durable = self.count

    def read(self, offset: int, limit: int, max_bytes: int | None = None) -> list[dict]:
        """Committed records [offset, offset + limit) in log order; fewer if their lines
        pass `max_bytes` (at least one)."""
        return read_sparse(self.path, self.sparse, self.durable, offset, limit, max_bytes)

    def close(self) -> None:
        self.log.close()
