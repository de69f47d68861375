"""An embedding job's corpus on the storage node's disk, read by row range.

Ingest reads the input files once, in a stream (never the whole corpus in memory),
and writes:

    jobs/<job>/corpus/texts.bin       one line per good row, `[id, text]` as JSON, in input order
    jobs/<job>/corpus/rows.bin        (byte offset, length) of each row in texts.bin, 12 bytes
                                      each, in partition order: a partition's rows are contiguous
    jobs/<job>/corpus/partitions.json [[name, size], ...] in order of first appearance
    jobs/<job>/corpus/corpus.json     totals, skipped rows, fingerprint; written last, so it
                                      marks a complete ingest

With a partition column the rows of one partition may be spread over many files; the
second pass places each row's (offset, length) at its partition's next slot in
rows.bin, in chunks, so memory stays O(partitions + chunk).

A read of (partition, start, end) is one read of rows.bin and, for rows stored
together (the usual case), one read of texts.bin.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import numpy as np
import orjson

from shoal.corpus_reader import CorpusReport, CorpusSpec, corpus_rows
from shoal.generate_input import InputError
from shoal.nodes.storage.input_store import check_name, write_atomic

ROW = np.dtype([("offset", "<u8"), ("length", "<u4")])
_ORDER = np.dtype([("offset", "<u8"), ("length", "<u4"), ("partition", "<u4")])
CHUNK_ROWS = 1 << 16


class Corpus:
    """One ingested corpus: its partition list in memory, its rows on disk."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.meta = orjson.loads((folder / "corpus.json").read_bytes())
        self.partitions: list[tuple[str, int]] = [tuple(p) for p in orjson.loads((folder / "partitions.json").read_bytes())]
        self.rows: dict[str, tuple[int, int]] = {}  # name -> (first row in rows.bin, size)
        pos = 0
        for name, size in self.partitions:
            self.rows[name] = (pos, size)
            pos += size
        self.total = pos

    def read(self, partition: str, start: int, end: int) -> list[tuple[str, str]]:
        """(id, text) of rows [start, end) of a partition, in input order."""
        if partition not in self.rows:
            raise InputError(f"corpus has no partition {partition!r}")
        base, size = self.rows[partition]
        if not 0 <= start <= end <= size:
            raise InputError(f"rows {start}-{end} are outside partition {partition!r} of {size} rows")
        if start == end:
            return []
        with open(self.folder / "rows.bin", "rb") as fh:
            rows = np.frombuffer(os.pread(fh.fileno(), (end - start) * ROW.itemsize, (base + start) * ROW.itemsize), ROW)
        offsets, lengths = rows["offset"].astype(np.int64), rows["length"].astype(np.int64)
        with open(self.folder / "texts.bin", "rb") as fh:
            if np.all(offsets[1:] == offsets[:-1] + lengths[:-1]):  # stored together: one read
                data = os.pread(fh.fileno(), int(offsets[-1] + lengths[-1] - offsets[0]), int(offsets[0]))
                cuts = np.concatenate(([0], np.cumsum(lengths)))
                lines = [data[cuts[i]:cuts[i + 1]] for i in range(len(lengths))]
            else:
                lines = [os.pread(fh.fileno(), int(n), int(o)) for o, n in zip(offsets, lengths)]
        return [tuple(orjson.loads(line)) for line in lines]


class CorpusStore:
    def __init__(self, root: str | Path):
        self.root = Path(root)
        self._open: dict[str, Corpus] = {}

    def folder(self, job_id: str) -> Path:
        return self.root / "jobs" / job_id / "corpus"

    def get(self, job_id: str) -> Corpus | None:
        if job_id not in self._open:
            check_name("job_id", job_id)
            folder = self.folder(job_id)
            if not (folder / "corpus.json").exists():
                return None
            self._open[job_id] = Corpus(folder)
        return self._open[job_id]

    def remove(self, job_id: str) -> None:
        """Deletes a job's stored corpus (a job refused after its corpus was read)."""
        import shutil

        self._open.pop(job_id, None)
        shutil.rmtree(self.folder(job_id), ignore_errors=True)

    def ingest(self, job_id: str, spec: CorpusSpec) -> Corpus:
        """Reads and stores a job's corpus once (a retried ingest finds it stored)."""
        known = self.get(job_id)
        if known is not None:
            return known
        folder = self.folder(job_id)
        folder.mkdir(parents=True, exist_ok=True)
        try:
            return self._ingest(job_id, spec, folder)
        except BaseException:  # a refused input leaves nothing behind
            self.remove(job_id)
            raise

    def _ingest(self, job_id: str, spec: CorpusSpec, folder: Path) -> Corpus:
        report = CorpusReport()
        index: dict[str, int] = {}
        counts: list[int] = []
        digest = hashlib.blake2b(digest_size=16)

        def partition_index(name: str) -> int:
            if name not in index:
                index[name] = len(counts)
                counts.append(0)
            return index[name]

        order_path = folder / "order.bin"
        with open(folder / "texts.bin", "wb") as texts, open(order_path, "wb") as order:
            offset = 0
            pending = []
            for part, rid, text in corpus_rows(spec, report, on_file=None if spec.partition_by else partition_index):
                line = orjson.dumps([rid, text]) + b"\n"
                texts.write(line)
                digest.update(line)
                p = partition_index(part)
                counts[p] += 1
                pending.append((offset, len(line), p))
                offset += len(line)
                if len(pending) >= CHUNK_ROWS:
                    order.write(np.array(pending, _ORDER).tobytes())
                    pending = []
            if pending:
                order.write(np.array(pending, _ORDER).tobytes())
            texts.flush()
            os.fsync(texts.fileno())
        self._place_rows(folder, order_path, counts)
        order_path.unlink()
        partitions = [[name, counts[i]] for name, i in index.items()]
        digest.update(orjson.dumps(partitions))
        write_atomic(folder / "partitions.json", orjson.dumps(partitions))
        meta = {"total": sum(counts), "partitions": len(partitions), "skipped": report.skipped,
                "errors": report.errors, "empty": [n for n, c in partitions if c == 0][:20],
                "fingerprint": digest.hexdigest(), "spec": spec.to_dict()}
        write_atomic(folder / "corpus.json", orjson.dumps(meta))
        return self.get(job_id)

    @staticmethod
    def _place_rows(folder: Path, order_path: Path, counts: list[int]) -> None:
        """rows.bin: each row's (offset, length) at its partition's next slot."""
        counts_a = np.array(counts, np.int64)
        starts = np.concatenate(([0], np.cumsum(counts_a)[:-1])) if len(counts) else counts_a
        seen = np.zeros(len(counts), np.int64)
        with open(order_path, "rb") as src, open(folder / "rows.bin", "wb") as dst:
            dst.truncate(int(counts_a.sum()) * ROW.itemsize)
            while True:
                chunk = np.frombuffer(src.read(CHUNK_ROWS * _ORDER.itemsize), _ORDER)
                if not len(chunk):
                    break
                pids = chunk["partition"].astype(np.int64)
                by_part = np.argsort(pids, kind="stable")
                sorted_pids = pids[by_part]
                first = np.concatenate(([True], sorted_pids[1:] != sorted_pids[:-1]))
                group_start = np.maximum.accumulate(np.where(first, np.arange(len(pids)), 0))
                slot = np.empty(len(pids), np.int64)
                slot[by_part] = starts[sorted_pids] + seen[sorted_pids] + (np.arange(len(pids)) - group_start)
                seen += np.bincount(pids, minlength=len(counts))
                rows = np.empty(len(pids), ROW)
                rows["offset"], rows["length"] = chunk["offset"], chunk["length"]
                at = np.argsort(slot, kind="stable")
                slot, rows = slot[at], rows[at]
                breaks = np.flatnonzero(slot[1:] != slot[:-1] + 1) + 1  # runs of consecutive slots: one write each
                for lo, hi in zip(np.concatenate(([0], breaks)), np.concatenate((breaks, [len(slot)]))):
                    os.pwrite(dst.fileno(), rows[lo:hi].tobytes(), int(slot[lo]) * ROW.itemsize)
            dst.flush()
            os.fsync(dst.fileno())
