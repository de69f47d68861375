"""An embedding job's output directory: one Parquet file per SuperBatch and a manifest.

    <dir>/manifest.jsonl      line 1: {"header": {encoder, dim, dtype, corpus}}; then one line
                              per written SuperBatch: {id, file, slices, rows, truncated}
    <dir>/partitions.json     the corpus's [[name, size], ...]: what complete coverage means
    <dir>/<superbatch id>.parquet   columns id (string), partition (string), row (int64),
                              vector (fixed-size list of float32 or float16)

A SuperBatch is written to a temporary name, fsynced and renamed, then its manifest
line is appended and fsynced: a SuperBatch is in the output exactly when its line is.
A crash between the two leaves a file the rerun overwrites (same content-derived
name); a torn last manifest line is dropped on open. A job run again over the same
directory skips every SuperBatch the manifest lists; the header refuses a rerun with
another encoder, dimension, dtype, corpus or packing (B_min, n_max: they fix the
SuperBatches, so a rerun with other ones would write rows twice), which would mix vectors that do not
belong together.
"""

from __future__ import annotations

import os
from pathlib import Path

import orjson

from shoal.protocol.errors import ShoalError

VECTOR_DTYPES = ("float32", "float16")


class OutputMismatch(ShoalError, ValueError):
    """The directory holds embeddings made differently; the message says how."""


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def read_manifest(folder: Path) -> tuple[dict | None, list[dict], int]:
    """(header, entries, byte length of the intact part) of a manifest; a torn last
    line (a crash mid-append) is not part of it."""
    path = folder / "manifest.jsonl"
    if not path.exists():
        return None, [], 0
    data = path.read_bytes()
    header, entries, good = None, [], 0
    for line in data.split(b"\n")[:-1]:  # a line without its newline is torn
        try:
            rec = orjson.loads(line)
        except orjson.JSONDecodeError:
            break
        if header is None:
            header = rec.get("header")
        else:
            entries.append(rec)
        good += len(line) + 1
    return header, entries, good


class EmbeddingOutput:
    def __init__(self, folder: str | Path, header: dict, partitions: list):
        """Opens (or starts) the output; raises OutputMismatch if it holds embeddings
        with another header."""
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.header = header
        found, entries, good = read_manifest(self.folder)
        path = self.folder / "manifest.jsonl"
        if found is not None:
            self.check_header(self.folder, found, header)
            with open(path, "r+b") as fh:
                fh.truncate(good)
        else:
            tmp = self.folder / "manifest.jsonl.tmp"
            with open(tmp, "wb") as fh:
                fh.write(orjson.dumps({"header": header}) + b"\n")
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, path)
            (self.folder / "partitions.json").write_bytes(orjson.dumps(partitions))
            _fsync_dir(self.folder)
        self.done: dict[str, dict] = {e["id"]: e for e in entries}
        self.rows = sum(e["rows"] for e in entries)
        self._manifest = open(path, "ab")

    @staticmethod
    def check_header(folder: Path, found: dict, header: dict) -> None:
        for key in ("dim", "dtype", "encoder", "corpus", "packing"):  # packing: [B_min, n_max] fix the SuperBatches
            if found.get(key) != header.get(key):
                raise OutputMismatch(
                    f"output {folder} holds embeddings with {key} {found.get(key)!r}, this job makes "
                    f"{key} {header.get(key)!r}: use another output directory, or remove that one to start over")

    def write(self, superbatch_id: str, slices: list, table, truncated: int = 0) -> bool:
        """Writes one SuperBatch's table; False if the manifest has it already (a
        re-sent write)."""
        import pyarrow.parquet as pq

        if superbatch_id in self.done:
            return False
        name = f"{superbatch_id}.parquet"
        tmp = self.folder / f".{name}.tmp"
        pq.write_table(table, tmp)
        with open(tmp, "rb+") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, self.folder / name)
        _fsync_dir(self.folder)
        entry = {"id": superbatch_id, "file": name, "slices": slices, "rows": table.num_rows, "truncated": truncated}
        self._manifest.write(orjson.dumps(entry) + b"\n")
        self._manifest.flush()
        os.fsync(self._manifest.fileno())
        self.done[superbatch_id] = entry
        self.rows += table.num_rows
        return True

    def close(self) -> None:
        self._manifest.close()
