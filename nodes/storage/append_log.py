"""An append-only file of JSON lines with group commit: what the result log, the
checkpoint store and the job log are each built on.

Appends are buffered; `commit()` makes everything appended since the last one durable
with one fsync (group commit: however many records arrived in between). On open the
records are read back in order up to the first line that is not a whole record its
owner accepts — the torn tail of a crash mid-append — and the file is cut there, so
every record before it is intact and the next append starts on a clean line.

A commit the disk has no room for (`ENOSPC`) is undone: the file is cut back to what
the last commit made durable and the records appended since are dropped, so the owner
can drop its own view of them too (`rollback`) and the sender, never acknowledged,
sends them again. Only committed records are ever in the file for a reader to see.
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
        self.fd: int | None = None
        self.size = 0  # bytes made durable: the file's length after the last commit
        self._buffer = bytearray()  # appended since
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
        self.size = good

    def _open(self) -> None:
        if self.fd is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def append(self, record: dict) -> int:
        """Buffers one record; returns its byte offset. In the file and durable after commit()."""
        offset = self.size + len(self._buffer)
        self._buffer += orjson.dumps(record) + b"\n"
        return offset

    @property
    def pending(self) -> bool:
        return bool(self._buffer)

    def commit(self) -> None:
        """Writes and fsyncs what was appended since the last commit. On any failure
        (a full disk) the file is cut back to its committed length, what was appended
        since is dropped, and the error is raised for the owner to roll back its view."""
        if not self._buffer:
            return
        self._open()
        try:
            done = os.write(self.fd, self._buffer)
            while done < len(self._buffer):  # a short write: the rest (a view, released at once)
                done += os.write(self.fd, memoryview(self._buffer)[done:])
            os.fsync(self.fd)
        except OSError:
            self._buffer.clear()
            os.ftruncate(self.fd, self.size)  # cutting back needs no space
            raise
        self.size += len(self._buffer)
        self._buffer.clear()

    def close(self) -> None:
        """Commits what is pending (a failure to is raised; the file stays whole) and closes."""
        try:
            self.commit()
        finally:
            if self.fd is not None:
                os.close(self.fd)
                self.fd = None
