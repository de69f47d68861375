"""A command's JSONL results file that a rerun continues instead of redoing.

`shoal generate`, `rag` and `batch` write each result as it arrives. If the command
dies (a crash, kill -9, a reboot), the results it wrote are kept: the same command
run again reads them, skips their items and appends the rest. What marks a run as
unfinished is a file beside the output, `<output>.unfinished`, holding a fingerprint of
the job (its items and everything that shapes their results); it is written before
the first result and removed once the last one is. So:

- no marker: a fresh start (an output left by a finished run is written over, as
  before);
- a marker with this job's fingerprint: resume;
- a marker of another job: refused (merging two jobs' results in one file would be
  wrong either way) unless `overwrite`.

A result is skipped on resume only if its whole line reached the file: a line torn by
the crash (or a tail of zeros a power loss can leave) is cut off and its item runs
again. Lines are flushed to the OS every `flush_every` seconds, so a killed command
loses at most that much work.
"""

from __future__ import annotations

import hashlib
import os
import sys
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

import orjson

FLUSH_EVERY_S = 0.5


def add_overwrite_flag(parser) -> None:
    parser.add_argument("--overwrite", action="store_true",
                        help="start over in an output that holds an unfinished run of another job (an "
                             "unfinished run of the same job is continued without it)")


def job_fingerprint(settings: dict, items: Iterable) -> str:
    """A digest of what determines a job's results: its settings and every item."""
    h = hashlib.sha256(orjson.dumps(settings, option=orjson.OPT_SORT_KEYS))
    for item in items:
        h.update(orjson.dumps(item, option=orjson.OPT_SORT_KEYS))
    return h.hexdigest()


class ResumableOutput:
    def __init__(self, path: str | Path, fingerprint: str, overwrite: bool = False,
                 flush_every: float = FLUSH_EVERY_S):
        self.path = Path(path)
        self.marker = self.path.with_name(self.path.name + ".unfinished")
        self.fingerprint = fingerprint
        self.flush_every = flush_every
        self.resuming = self._continues_a_run(overwrite)
        self.kept = 0  # results of the earlier run kept in the file
        self.written = 0  # results this run wrote
        self._good_bytes = 0
        self._fh = None
        self._flushed_at = 0.0

    def _continues_a_run(self, overwrite: bool) -> bool:
        if overwrite or not self.marker.exists() or not self.path.exists():
            return False
        try:
            theirs = orjson.loads(self.marker.read_bytes()).get("fingerprint")
        except (orjson.JSONDecodeError, AttributeError):
            theirs = None  # a marker torn by the crash: it cannot vouch for the file
        if theirs != self.fingerprint:
            raise FileExistsError(
                f"{self.path} holds the results of an unfinished run of another job (other items, model or "
                f"settings); give another output, or --overwrite to start this job over in it")
        return True

    def earlier_results(self) -> Iterator[dict]:
        """The whole records an interrupted run of this job wrote (none on a fresh start).
        Read them before `open`, which cuts the file after the last of them."""
        if not self.resuming:
            return
        with open(self.path, "rb") as fh:
            for line in fh:
                if not line.endswith(b"\n"):
                    break
                try:
                    rec = orjson.loads(line)
                except orjson.JSONDecodeError:
                    break
                if not isinstance(rec, dict):
                    break
                self._good_bytes += len(line)
                self.kept += 1
                yield rec

    def open(self) -> "ResumableOutput":
        tmp = self.marker.with_name(self.marker.name + ".tmp")
        tmp.write_bytes(orjson.dumps({"fingerprint": self.fingerprint}))
        os.replace(tmp, self.marker)  # whole or absent, never torn
        if self.resuming:
            self._fh = open(self.path, "r+b")
            self._fh.truncate(self._good_bytes)
            self._fh.seek(self._good_bytes)
        else:
            self._fh = open(self.path, "wb")
        self._flushed_at = time.monotonic()
        return self

    def write(self, rec: dict) -> None:
        self._fh.write(orjson.dumps(rec) + b"\n")
        self.written += 1
        now = time.monotonic()
        if now - self._flushed_at >= self.flush_every:
            self._fh.flush()
            self._flushed_at = now

    def flush(self) -> None:
        self._fh.flush()

    def finish(self) -> None:
        """Every result is in: the run is no longer unfinished."""
        self._fh.close()
        self.marker.unlink(missing_ok=True)

    def __enter__(self) -> "ResumableOutput":
        return self.open() if self._fh is None else self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.finish()
            return
        self._fh.close()
        print(f"{self.kept + self.written} results are kept in {self.path}; the same command run again "
              f"runs only the rest", file=sys.stderr)
