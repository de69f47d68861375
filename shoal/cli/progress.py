"""Progress of a long command: a tqdm bar (count, rate, ETA) on a terminal or in a
notebook; in a log (stderr not a terminal) a plain line every `log_every` seconds, so a
job's log shows it is moving without filling up with redraws."""

from __future__ import annotations

import sys

LOG_EVERY_S = 30.0


class _Lines:
    """A stream for tqdm that writes each redraw as a line of its own."""

    def __init__(self, stream):
        self.stream = stream

    def write(self, s: str) -> None:
        text = s.strip("\r\n")
        if text.strip():
            self.stream.write(text + "\n")

    def flush(self) -> None:
        self.stream.flush()


class Progress:
    def __init__(self, total: int, unit: str, stream=None, log_every: float = LOG_EVERY_S):
        from tqdm.auto import tqdm

        stream = stream or sys.stderr
        tty = hasattr(stream, "isatty") and stream.isatty()
        self.total, self.unit = total, unit
        self.done = 0
        self.bar = tqdm(total=total, unit=f" {unit}", file=stream if tty else _Lines(stream), dynamic_ncols=tty,
                        smoothing=0.1, mininterval=0.2 if tty else log_every, maxinterval=10 if tty else log_every,
                        ascii=not tty, leave=True)

    def advance(self, n: int = 1, note: str = "") -> None:
        self.done += n
        if note:
            self.bar.set_postfix_str(note, refresh=False)
        self.bar.update(n)

    def close(self) -> None:
        self.bar.close()
