"""The storage node's disk as its writes see it: full is a state, not a crash.

A write that would leave less than `reserve` bytes free is refused with a `disk_full`
error naming the directory and its free bytes; reads go on. The reserve keeps room for
what must still be written while the disk is full (the job log's state changes, a
write already under way), and a write that runs out of space anyway (`ENOSPC` from
the kernel: another process filled the disk between the check and the write) is
undone by its owner and refused the same way. Nothing refused was acknowledged, so
the sender (a worker's result writer, a client's submit) keeps it and tries again;
once space is freed the same writes are taken.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

from shoal.protocol.errors import ProtocolError

DEFAULT_RESERVE_BYTES = 64 << 20
ROOM_AFTER_REFUSAL = 1 << 20
OUT_OF_SPACE = (errno.ENOSPC, errno.EDQUOT)


def is_out_of_space(e: BaseException) -> bool:
    return isinstance(e, OSError) and e.errno in OUT_OF_SPACE


def free_bytes(path: str | Path) -> int:
    """Bytes an unprivileged writer may still use on the filesystem holding `path`."""
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


class DiskSpace:
    def __init__(self, node_id: str, path: str | Path, reserve_bytes: int = DEFAULT_RESERVE_BYTES):
        self.node_id = node_id
        self.path = Path(path)
        self.reserve = reserve_bytes
        # After the kernel refused a write, the free space writes wait for: more than
        # there was then (not to fail the same write again at once).
        self.wait_for = 0
        self.path.mkdir(parents=True, exist_ok=True)

    def free(self) -> int:
        return free_bytes(self.path)

    def _needed(self) -> int:
        return max(self.reserve, self.wait_for)

    def problem(self) -> str:
        """Why writes are refused now ("" while they are taken)."""
        free = self.free()
        if free >= self._needed():
            self.wait_for = 0
            return ""
        return self.describe(free)

    def describe(self, free: int | None = None) -> str:
        free = self.free() if free is None else free
        return (f"{self.node_id}'s disk is full: {self.path} has {free:,} bytes free "
                f"(writes wait for {self._needed():,}); free space there and the writes go on")

    def check(self) -> None:
        """Raises `disk_full` if a write should not be taken now."""
        why = self.problem()
        if why:
            raise ProtocolError(ProtocolError.DISK_FULL, why)

    def refused(self, e: OSError) -> ProtocolError:
        """The `disk_full` error for a write the kernel refused for want of space: on
        this directory's disk, or on another one a request named (an output folder)."""
        where = Path(e.filename).parent if e.filename else self.path
        try:
            free = free_bytes(where)
        except OSError:
            where, free = self.path, self.free()
        if where == self.path:
            self.wait_for = free + ROOM_AFTER_REFUSAL
        return ProtocolError(ProtocolError.DISK_FULL, f"{self.node_id}'s disk is full: {where} has {free:,} bytes "
                                                      f"free ({e.strerror}); free space there and the writes go on")

    def state(self) -> dict:
        free = self.free()
        return {"dir": str(self.path), "free_bytes": free, "reserve_bytes": self.reserve, "full": bool(self.problem())}
