"""Job inputs on the storage node's disk.

A job's input arrives one of three ways: items inline in the submit (small jobs), an
upload sent in chunks (large jobs; no single message carries it all), or a path the
storage node can read (JSONL or Parquet, e.g. on shared disk). Ingesting checks every
record (ids unique, each a well-formed item) and writes one normalized JSONL file per
job, made durable before the job is accepted; the scheduler then reads it in pages, so
neither it nor any message ever holds a whole large input.

Layout under the node's directory:
    uploads/<upload_id>/<index>.part   chunks as received (a re-sent chunk replaces itself; one
                                       upload per submit call, swept when abandoned)
    jobs/<job_id>/input.jsonl          the checked, normalized items, in input order
    jobs/<job_id>/input.json           {"total": N}; written last, so it marks a complete ingest
"""

from __future__ import annotations

import os
import re
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import orjson

from shoal.generate_input import MAX_ITEM_BYTES, InputError, ItemChecker, parse_jsonl, read_records

STRIDE = 1024  # one line offset kept per this many items: pages are read in order, so the skip is rare
UPLOAD_TTL_S = 24 * 3600  # an upload no chunk arrived for in this long was abandoned (its client failed mid-way)

_NAME = re.compile(r"^[A-Za-z0-9._-]{1,128}$")


def check_name(kind: str, name: str) -> str:
    """Ids become directory names: refuse anything that could leave the data directory."""
    if not isinstance(name, str) or not _NAME.match(name) or name in (".", ".."):
        raise InputError(f"{kind} {name!r} is not a valid id (letters, digits, '.', '_', '-')")
    return name


def write_atomic(path: Path, data: bytes) -> None:
    """Writes a small file so that it is either wholly there or not at all."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
    except BaseException:  # a full disk: what was written goes, not to hold the space
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, path)


class InputStore:
    def __init__(self, root: str | Path, max_item_bytes: int = MAX_ITEM_BYTES):
        self.root = Path(root)
        self.max_item_bytes = max_item_bytes
        self._offsets: dict[str, list[int]] = {}  # job -> byte offset of every STRIDE-th item line
        self._totals: dict[str, int] = {}

    # -- uploads -------------------------------------------------------------------------------

    def put_chunk(self, upload_id: str, index: int, data: bytes) -> None:
        if index < 0:
            raise InputError(f"upload {upload_id}: chunk index must be >= 0, got {index}")
        d = self.root / "uploads" / check_name("upload_id", upload_id)
        d.mkdir(parents=True, exist_ok=True)
        write_atomic(d / f"{index:08d}.part", data)

    def sweep_uploads(self, max_age_s: float = UPLOAD_TTL_S, now: float | None = None) -> int:
        """Removes uploads abandoned part-way (the client failed or gave up before its
        submit): none of their chunks written for `max_age_s`. Each submit uploads under
        an id of its own, so such a leftover is never read; this only frees its space."""
        now = time.time() if now is None else now
        removed = 0
        for d in (self.root / "uploads").glob("*") if (self.root / "uploads").is_dir() else ():
            try:
                newest = max((p.stat().st_mtime for p in d.iterdir()), default=d.stat().st_mtime)
            except OSError:  # removed meanwhile
                continue
            if now - newest > max_age_s:
                shutil.rmtree(d, ignore_errors=True)
                removed += 1
        return removed

    def _upload_lines(self, upload_id: str) -> Iterator[bytes]:
        d = self.root / "uploads" / check_name("upload_id", upload_id)
        parts = sorted(d.glob("*.part")) if d.is_dir() else []
        if not parts:
            raise InputError(f"upload {upload_id} has no chunks")
        indices = [int(p.stem) for p in parts]
        if indices != list(range(len(parts))):
            missing = sorted(set(range(max(indices) + 1)) - set(indices))
            raise InputError(f"upload {upload_id} is missing chunk {missing[0]}")
        rest = b""  # a line may span chunks; read a line at a time, never a chunk's lines at once
        for p in parts:
            with open(p, "rb") as fh:
                for line in fh:
                    if rest:
                        line, rest = rest + line, b""
                    if line.endswith(b"\n"):
                        yield line
                    else:
                        rest = line
        if rest:
            yield rest

    # -- ingest --------------------------------------------------------------------------------

    def total(self, job_id: str) -> int | None:
        if job_id not in self._totals:
            meta = self.root / "jobs" / check_name("job_id", job_id) / "input.json"
            if not meta.exists():
                return None
            self._totals[job_id] = orjson.loads(meta.read_bytes())["total"]
        return self._totals[job_id]

    def ingest(self, job_id: str, items: list | None = None, upload_id: str = "", input_path: str = "",
               program: str = "generate") -> int:
        """Checks (as items of `program`) and stores a job's input once; returns its item
        count. Ingesting a job that is already stored returns its count (the submit was
        retried)."""
        known = self.total(job_id)
        if known is not None:
            if upload_id:  # the upload was re-sent by a retried submit: not needed again
                shutil.rmtree(self.root / "uploads" / check_name("upload_id", upload_id), ignore_errors=True)
            return known
        sources = [s for s in (items, upload_id, input_path) if s]
        if len(sources) > 1:
            raise InputError("give a job's input one way: items, an upload or a path")
        if upload_id:  # checked before anything is named by it (a refused ingest removes its upload)
            check_name("upload_id", upload_id)
        if upload_id:
            records = parse_jsonl(self._upload_lines(upload_id), f"upload {upload_id}")
        elif input_path:
            records = read_records(input_path)
        else:
            records = ((f"item {i}", i, rec) for i, rec in enumerate(items or [], 1))
        d = self.root / "jobs" / job_id
        d.mkdir(parents=True, exist_ok=True)
        checker, total = ItemChecker(program, self.max_item_bytes), 0
        tmp = d / "input.jsonl.tmp"
        try:
            with open(tmp, "wb") as out:
                for where, place, rec in records:
                    out.write(orjson.dumps(checker.record(rec, where, place)) + b"\n")
                    total += 1
                out.flush()
                os.fsync(out.fileno())
        except BaseException as e:  # a bad item or a full disk: nothing half-written stays
            tmp.unlink(missing_ok=True)
            if upload_id and isinstance(e, InputError):  # a corrected input comes as an upload of its own;
                shutil.rmtree(self.root / "uploads" / upload_id, ignore_errors=True)  # a full disk's is retried
            raise
        os.replace(tmp, d / "input.jsonl")
        write_atomic(d / "input.json", orjson.dumps({"total": total}))
        if upload_id:
            shutil.rmtree(self.root / "uploads" / upload_id, ignore_errors=True)
        return total

    def forget(self, job_id: str) -> None:
        """Drops a finished job's line offsets (read again from its file if ever needed)."""
        self._offsets.pop(job_id, None)

    # -- reading -------------------------------------------------------------------------------

    def read(self, job_id: str, offset: int, limit: int, max_bytes: int, keep=None,
             scan: int = 1 << 14, extra=None) -> tuple[list[dict], int]:
        """Up to `limit` items from input position `offset`, fewer if they pass
        max_bytes, and the position to read next. With `keep` (a predicate on an
        item), only the items it keeps; up to `scan` lines are looked at per call.
        `extra(item)`: bytes that travel with a kept item (its checkpoint) and count
        against max_bytes too."""
        total = self.total(job_id)
        if total is None:
            raise InputError(f"job {job_id} has no stored input")
        path = self.root / "jobs" / job_id / "input.jsonl"
        if job_id not in self._offsets:  # one streaming pass: never the whole file in memory
            sparse, at = [], 0
            with open(path, "rb") as fh:
                for k, line in enumerate(fh):
                    if k % STRIDE == 0:
                        sparse.append(at)
                    at += len(line)
            self._offsets[job_id] = sparse
        sparse = self._offsets[job_id]
        out, size, pos = [], 0, offset
        with open(path, "rb") as fh:
            if pos < total:  # the nearest kept offset, then the lines up to `offset`
                fh.seek(sparse[pos // STRIDE])
                for _ in range(pos % STRIDE):
                    fh.readline()
            while pos < total and len(out) < limit and pos - offset < scan:
                line = fh.readline()
                item = orjson.loads(line)
                kept = keep is None or keep(item)
                weight = len(line) + (extra(item) if kept and extra else 0)
                if out and size + weight > max_bytes:
                    break
                pos += 1
                if kept:
                    out.append(item)
                    size += weight
        return out, pos
