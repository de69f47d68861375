"""Compacting a finished job's result log into shards: `results.jsonl` and `results.parquet`.

The write-ahead log already holds each item's first result once; compaction turns it
into files people read with their own tools. It streams (a million results never sit
in memory at once) and writes each file beside a `.tmp` name first, so a crash leaves
either the whole shard or none.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import orjson

from shoal.results_parquet import iter_jsonl, jsonl_to_parquet

log = logging.getLogger(__name__)


def write_jsonl(wal: Path, out: Path) -> None:
    tmp = out.with_name(out.name + ".tmp")
    try:
        with open(tmp, "wb") as fh:
            for rec in iter_jsonl(wal):
                fh.write(orjson.dumps(rec) + b"\n")
            fh.flush()
            os.fsync(fh.fileno())
    except BaseException:  # a full disk: the half-written shard goes, not to hold the space
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, out)


def compact(wal: str | Path) -> dict[str, str]:
    """Writes the shards beside the log; returns what was written. A Parquet failure
    (e.g. a field whose type changes between records) is logged and the JSONL shard
    still stands."""
    wal = Path(wal)
    written = {}
    write_jsonl(wal, wal.with_name("results.jsonl"))
    written["jsonl"] = str(wal.with_name("results.jsonl"))
    try:
        jsonl_to_parquet(wal, wal.with_name("results.parquet"))
        written["parquet"] = str(wal.with_name("results.parquet"))
    except Exception as e:  # noqa: BLE001 - pyarrow's errors have many types; the JSONL shard stands
        wal.with_name("results.parquet.tmp").unlink(missing_ok=True)
        if isinstance(e, OSError):  # the disk (full, failing): not the data; the caller tries again
            raise
        log.warning("[compact] %s: no Parquet shard (%s)", wal.parent.name, e)
    return written


DISK_EXIT = 3  # the child's exit status when the disk refused a write


def compact_in_child(wal: str | Path) -> dict[str, str]:
    """`compact` in a process of its own: Parquet's writer (pyarrow, ~50 MB once imported)
    and what it allocates go when the child exits, so a storage node's memory is back to
    its idle size after a job; and a million records' conversion does not hold the GIL the
    node's loop needs. Raises OSError if the disk had no room (the caller tries again)."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-P", "-m", "shoal.nodes.storage.result_compaction", str(wal)],
                          capture_output=True)
    why = done.stderr.decode(errors="replace").strip().splitlines()[-1:] or [f"exit status {done.returncode}"]
    if done.returncode == DISK_EXIT:
        raise OSError(why[0])
    if done.returncode != 0:
        raise RuntimeError(f"compacting {wal} failed: {why[0]}")
    return orjson.loads(done.stdout)


def main(argv: list[str] | None = None) -> int:
    import sys

    (wal,) = argv if argv is not None else sys.argv[1:]
    try:
        written = compact(wal)
    except OSError as e:
        print(f"{type(e).__name__}: {e}", file=sys.stderr)
        return DISK_EXIT
    sys.stdout.buffer.write(orjson.dumps(written))
    return 0


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    raise SystemExit(main())
