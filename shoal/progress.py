"""A one-line progress bar with throughput, on a terminal only."""

from __future__ import annotations

import sys
import time


class Progress:
    def __init__(self, total: int, unit: str, stream=sys.stderr):
        self.total, self.unit, self.stream = total, unit, stream
        self.done = 0
        self.enabled = stream.isatty()
        self._last = 0.0

    def advance(self, n: int = 1, note: str = "") -> None:
        self.done += n
        now = time.monotonic()
        if self.enabled and (now - self._last > 0.2 or self.done >= self.total):
            self._last = now
            frac = self.done / max(self.total, 1)
            bar = "#" * int(30 * frac)
            self.stream.write(f"\r[{bar:<30}] {self.done}/{self.total} {self.unit} {note}   ")
            self.stream.flush()

    def close(self) -> None:
        if self.enabled:
            self.stream.write("\n")
