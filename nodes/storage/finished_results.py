"""A finished job's results, served from its write-ahead log with almost nothing in memory.

While a job runs, its `ResultLog` keeps every record's offset and every item id, so
that a read by offset is one seek and a duplicate is refused at once. Once every item
has its result the log no longer changes (any later write is a duplicate), so that
state is dropped for this view: the record count, the failures, and the offset of every
`STRIDE`-th record (a read seeks to the nearest and skips at most STRIDE - 1 lines).
A million results cost about 1,000 integers instead of some hundreds of megabytes; a
storage node's memory then follows the jobs in flight, not every job it ever held.
"""

from __future__ import annotations

from pathlib import Path

import orjson

from shoal.nodes.storage.result_log import STRIDE, read_sparse



class FinishedResults:
    def __init__(self, wal: str | Path, log=None):
        """From the finished job's `ResultLog` when this process ran it (its offsets
        and counts, nothing read); else by one streaming pass over the log."""
        self.path = Path(wal)
        self.sparse: list[int] = []  # byte offset of records 0, STRIDE, 2 * STRIDE, ...
        self.count = self.failed = 0
        if log is not None:
            self.sparse = log.sparse[: (len(log) + STRIDE - 1) // STRIDE]
            self.count, self.failed = len(log), log.failed
            return
        with open(self.path, "rb") as fh:  # streamed: never the whole log in memory
            offset = 0
            for line in fh:
                if not line.endswith(b"\n"):
                    break  # a torn tail (the log's own open cuts it off; here it is not a record)
                if self.count % STRIDE == 0:
                    self.sparse.append(offset)
                self.failed += orjson.loads(line).get("finish_reason") == "error"
                self.count += 1
                offset += len(line)

    def __len__(self) -> int:
        return self.count

    def __contains__(self, item_id) -> bool:
        """Every item of a finished job has its result (a worker only writes its job's ids)."""
        return True

    def append(self, records: list[dict]) -> tuple[int, int]:
        """Late copies of results already here (at-least-once delivery): all duplicates."""
        return 0, len(records)

    def read(self, offset: int, limit: int, max_bytes: int | None = None) -> list[dict]:
        """Records [offset, offset + limit) in log order; fewer if their lines pass
        `max_bytes` (at least one)."""
        return read_sparse(self.path, self.sparse, self.count, offset, limit, max_bytes)

    def commit(self) -> None:
        pass

    def close(self) -> None:
        pass
