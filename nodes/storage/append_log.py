"""An append-only file of JSON lines with group commit: what the result log, the
checkpoint store and the job log are each built on.

Appends are buffered; `commit()` makes everything appended since the last one durable
with one fsync (group commit: however many records arrived in between). On open the
records are read back in order up to the first line that is not a whole record its
owner accepts — the torn tail of a crash mid-append — and the file is cut there, so
every record before it is intact and the next append starts on a clean line.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import orjson

# What a record that is not whole raises in its owner's reader (a field missing, a
# wrong type): the line is torn, like one that is not JSON.
TORN = (orjson.JSONDecodeError, KeyError, TypeError, ValueError)


class AppendLog:
    def __init__(self, path: str | Path, on_record: Callable[[int, dict], None], create: bool = True):
        """Reads back what the file holds, calling on_record(byte offset, record) for
        each whole one. With `create` the file exists from now on; without, from the
        first append."""
        self.path = Path(path)
        self.fh = None
        self._dirty = False
        self._recover(on_record)
        if create:
            self._open()

    def _recover(self, on_record) -> None:
        if not self.path.exists():
            return
        data = self.path.read_bytes()
        pos = good = 0
        while (end := data.find(b"\n", pos)) >= 0:
            try:
                on_record(pos, orjson.loads(data[pos:end]))
            except TORN:
                break
            pos = good = end + 1
        if good < len(data):
            with open(self.path, "r+b") as fh:
                fh.truncate(good)

    def _open(self) -> None:
        if self.fh is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.fh = open(self.path, "ab")

    def append(self, record: dict) -> int:
        """Buffers one record; returns its byte offset. Durable after commit()."""
        self._open()
        offset = self.fh.tell()
        self.fh.write(orjson.dumps(record) + b"\n")
        self._dirty = True
        return offset

    def flush(self) -> None:
        """Hands buffered lines to the OS, so a reader of the file sees them (not durable)."""
        if self.fh is not None:
            self.fh.flush()

    def commit(self) -> None:
        if self._dirty:
            self.fh.flush()
            os.fsync(self.fh.fileno())
            self._dirty = False

    def close(self) -> None:
        if self.fh is not None:
            self.commit()
            self.fh.close()
            self.fh = None
