"""A command's JSONL results file that a rerun continues instead of redoing.

`shoal generate`, `rag` and `batch` write each result as it arrives. If the command
dies (a crash, kill -9, a reboot), the results it wrote are kept: the same command
run again reads them, skips their items and appends the rest. What marks a run as
unfinished is a file beside the results, `<file>.unfinished`, holding a fingerprint of
the job (its items and everything that shapes their results); it is written once the
file is open and removed once the last result is on disk. So:

- no marker: a fresh start (a file left by a finished run is written over, as before);
- a marker with this job's fingerprint: resume;
- a marker of another job over a file that holds results: refused (merging two jobs'
  results in one file would be wrong either way) unless `overwrite`; over a file with
  none (a run that failed before its first result) it is a fresh start.

A result is skipped on resume only if its whole line reached the file: a line torn by
the crash (or a tail of zeros a power loss can leave) is cut off and its item runs
again. Each line is handed to the OS as it is written, so a killed command loses only
the results it had not received yet.
"""

from __future__ import annotations

import hashlib
import os
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path

import orjson


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
    def __init__(self, path: str | Path, fingerprint: str, overwrite: bool = False):
        self.path = Path(path)
        self.marker = self.path.with_name(self.path.name + ".unfinished")
        self.fingerprint = fingerprint
        self.resuming = self._continues_a_run(overwrite)
        self.kept = 0  # results of the earlier run kept in the file
        self.written = 0  # results this run wrote
        self._good_bytes = 0
        self._scanned = not self.resuming
        self._fh = None

    def _continues_a_run(self, overwrite: bool) -> bool:
        if overwrite or not self.marker.exists() or not self.path.exists():
            return False
        try:
            theirs = orjson.loads(self.marker.read_bytes()).get("fingerprint")
        except (orjson.JSONDecodeError, AttributeError):
            theirs = None  # a marker torn by the crash: it cannot vouch for the file
        if theirs == self.fingerprint:
            return True
        if not self._holds_a_line():
            return False  # nothing to lose: the other run died before its first result
        raise FileExistsError(
            f"{self.path} holds the results of an unfinished run of another job (other items, model or "
            f"settings); give another output, or --overwrite to start this job over in it")

    def _holds_a_line(self) -> bool:
        with open(self.path, "rb") as fh:
            while chunk := fh.read(1 << 20):
                if b"\n" in chunk:
                    return True
        return False

    def earlier_results(self) -> Iterator[dict]:
        """The whole records an interrupted run of this job wrote (none on a fresh start),
        read before `open`, which cuts the file after the last of them."""
        if self._scanned:
            return
        self._good_bytes = self.kept = 0  # from the top, whatever an abandoned read counted
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
        self._scanned = True

    def open(self) -> "ResumableOutput":
        if self.resuming:
            for _ in self.earlier_results():  # what the caller left unread still counts
                pass
            self._fh = open(self.path, "r+b", buffering=0)
            self._fh.truncate(self._good_bytes)
            self._fh.seek(self._good_bytes)
        else:
            # The file is emptied before the marker names this job: a marker never vouches
            # for what an earlier run left in it.
            self._fh = open(self.path, "wb", buffering=0)
        tmp = self.marker.with_name(self.marker.name + ".tmp")
        tmp.write_bytes(orjson.dumps({"fingerprint": self.fingerprint}))
        os.replace(tmp, self.marker)  # whole or absent, never torn
        return self

    def write(self, rec: dict) -> None:
        line = memoryview(orjson.dumps(rec) + b"\n")
        while line:  # unbuffered: in the OS's hands at once (a raw write may take only part)
            line = line[self._fh.write(line):]
        self.written += 1

    def finish(self) -> None:
        """Every result is in: on disk first (after a power loss a file without its
        marker would pass for a finished one), then the run is no longer unfinished."""
        os.fsync(self._fh.fileno())
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
