"""First-fit allocation of contiguous spans in a fixed arena, with freed spans merged
with their free neighbours: the host KV pool's bookkeeping (`host_kv_pool.py`). Pure
logic, no tensors."""

from __future__ import annotations

import bisect


class SpanAllocator:
    def __init__(self, size: int):
        self.size = size
        self.free: list[tuple[int, int]] = [(0, size)] if size > 0 else []  # (start, length), by start
        self.used = 0

    def allocate(self, length: int) -> int | None:
        """The start of a free span of `length`, or None where no free span is that long."""
        if length <= 0:
            raise ValueError(f"a span needs a positive length, not {length}")
        for i, (start, free) in enumerate(self.free):
            if free >= length:
                if free == length:
                    del self.free[i]
                else:
                    self.free[i] = (start + length, free - length)
                self.used += length
                return start
        return None

    def release(self, start: int, length: int) -> None:
        i = bisect.bisect_left(self.free, (start, 0))
        before = self.free[i - 1] if i > 0 else None
        after = self.free[i] if i < len(self.free) else None
        if (before and before[0] + before[1] > start) or (after and start + length > after[0]):
            raise ValueError(f"span [{start}, {start + length}) overlaps a free span: released twice?")
        self.used -= length
        if before and before[0] + before[1] == start:  # merge with the span before
            start, length = before[0], before[1] + length
            del self.free[i - 1]
            i -= 1
        if after and start + length == after[0]:  # and with the one after
            length += after[1]
            del self.free[i]
        self.free.insert(i, (start, length))
