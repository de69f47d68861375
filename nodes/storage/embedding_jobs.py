"""The storage node's side of embedding jobs: the corpus (`corpus_store.py`) and the
output (`embedding_output.py`) of each job, and the handlers that serve them.

    IngestCorpus     read the input files once, open the output (its header must match)
    ReadPartitions   the partition list, in pages (the scheduler packs SuperBatches from it)
    ReadManifest     the SuperBatch ids the output holds, in pages (what a restart skips)
    ReadTexts        a SuperBatch's texts, for a worker, as an Arrow table
    WriteEmbeddings  a SuperBatch's vectors: written atomically, once

Where a job's output lives and what it must hold is recorded beside its corpus, so a
restarted storage node reopens both.
"""

from __future__ import annotations

import logging
from pathlib import Path

import orjson

from shoal.corpus_reader import CorpusSpec
from shoal.generate_input import InputError
from shoal.nodes.storage.corpus_store import CorpusStore
from shoal.nodes.storage.input_store import check_name, write_atomic
from shoal.embedding_output import VECTOR_DTYPES, EmbeddingOutput, OutputMismatch
from shoal.protocol.arrow_table import table_from_ipc, table_to_ipc
from shoal.protocol.codec import Message, encode
from shoal.protocol.errors import ProtocolError

log = logging.getLogger(__name__)


def _bad(message: str) -> ProtocolError:
    return ProtocolError(ProtocolError.BAD_INPUT, message)


class EmbeddingJobs:
    def __init__(self, root: Path, counters=None, data_roots=None):
        self.corpora = CorpusStore(root)
        self.outputs: dict[str, EmbeddingOutput] = {}  # job -> its output
        self.by_dir: dict[str, EmbeddingOutput] = {}  # resolved directory -> the one writer of it
        self.counters = counters
        self.data_roots = data_roots  # where a job's corpus and output may be
        self.highwater = {"texts_per_read": 0, "rows_per_write": 0}

    def handlers(self) -> dict:
        return {"IngestCorpus": self.on_ingest, "ReadPartitions": self.on_read_partitions,
                "ReadManifest": self.on_read_manifest, "ReadTexts": self.on_read_texts,
                "WriteEmbeddings": self.on_write}

    def _corpus(self, job_id: str):
        try:
            corpus = self.corpora.get(job_id)
        except InputError as e:
            raise ProtocolError(ProtocolError.INVALID_FIELD, str(e)) from None
        if corpus is None:
            raise ProtocolError(ProtocolError.UNKNOWN_JOB, f"job {job_id} has no stored corpus")
        return corpus

    def output(self, job_id: str) -> EmbeddingOutput | None:
        if job_id not in self.outputs:
            try:
                corpus = self.corpora.get(job_id)
            except InputError as e:
                raise ProtocolError(ProtocolError.INVALID_FIELD, str(e)) from None
            if corpus is None or not (corpus.folder / "output.json").exists():
                return None
            rec = orjson.loads((corpus.folder / "output.json").read_bytes())
            self.outputs[job_id] = self._open_output(rec["dir"], rec["header"], [list(p) for p in corpus.partitions])
        return self.outputs[job_id]

    def _open_output(self, folder: str, header: dict, partitions: list) -> EmbeddingOutput:
        """One EmbeddingOutput per directory, whichever jobs write to it (a rerun under
        another job key shares the manifest, and its SuperBatches are written once)."""
        key = str(Path(folder).resolve())
        out = self.by_dir.get(key)
        if out is None:
            out = self.by_dir[key] = EmbeddingOutput(key, header, partitions)
        elif out.header != header:
            EmbeddingOutput.check_header(out.folder, out.header, header)
        return out

    def on_ingest(self, msg: Message):
        try:
            job_id = check_name("job_id", msg["job_id"])
        except InputError as e:
            raise ProtocolError(ProtocolError.INVALID_FIELD, str(e)) from None
        header = dict(msg["header"])
        if header.get("dtype") not in VECTOR_DTYPES:
            raise _bad(f"vector dtype must be one of {VECTOR_DTYPES}, got {header.get('dtype')!r}")
        if not isinstance(header.get("dim"), int) or header["dim"] <= 0 or not header.get("encoder"):
            raise _bad("the output header needs the encoder's fingerprint and its dimension")
        if not msg["output"]:
            raise _bad("an embedding job needs an output directory")
        output_dir, spec = msg["output"], msg["corpus"]
        if self.data_roots is not None:  # the paths as checked (links resolved) are the ones opened
            output_dir = str(self.data_roots.check(output_dir, "output directory"))
            if isinstance(spec, dict) and isinstance(spec.get("inputs"), list):
                spec = {**spec, "inputs": [str(self.data_roots.check(p, "corpus file")) for p in spec["inputs"]]}
        try:
            corpus = self.corpora.ingest(job_id, CorpusSpec.from_dict(spec))
        except InputError as e:
            raise _bad(str(e)) from None
        header["corpus"] = corpus.meta["fingerprint"]
        try:
            output = self._open_output(output_dir, header, [list(p) for p in corpus.partitions])
        except (OutputMismatch, OSError) as e:  # the job is refused: its copy of the corpus goes too
            self.corpora.remove(job_id)
            raise _bad(str(e) if isinstance(e, OutputMismatch) else f"output {msg['output']}: {e.strerror or e}") from None
        self.outputs[job_id] = output
        write_atomic(corpus.folder / "output.json", orjson.dumps({"dir": str(Path(output_dir).resolve()),
                                                                   "header": header}))
        # The output names its corpus: `shoal index build` takes the passages' texts from it.
        write_atomic(Path(output_dir) / "corpus.json", orjson.dumps({"dir": str(corpus.folder.resolve())}))
        m = corpus.meta
        log.info("[embed] %s: %d texts in %d partitions stored (%d bad rows skipped); output %s holds %d",
                 job_id, m["total"], m["partitions"], m["skipped"], output_dir, output.rows)
        return encode("CorpusReady", {"job_id": job_id, "total": m["total"], "partitions": m["partitions"],
                                      "skipped": m["skipped"], "errors": m["errors"], "empty": m["empty"],
                                      "done": output.rows}, reply_to=msg.id)

    def on_read_partitions(self, msg: Message):
        corpus = self._corpus(msg["job_id"])
        lo, hi = msg["offset"], msg["offset"] + max(1, min(msg["limit"], 8192))
        page = [list(p) for p in corpus.partitions[lo:hi]]
        return encode("PartitionPage", {"job_id": msg["job_id"], "partitions": page, "next_offset": lo + len(page),
                                        "total": len(corpus.partitions)}, reply_to=msg.id)

    def on_read_manifest(self, msg: Message):
        output = self.output(msg["job_id"])
        ids = list(output.done) if output is not None else []
        lo = msg["offset"]
        page = ids[lo:lo + max(1, min(msg["limit"], 8192))]
        return encode("ManifestPage", {"job_id": msg["job_id"], "ids": page, "next_offset": lo + len(page),
                                       "total": len(ids)}, reply_to=msg.id)

    def on_read_texts(self, msg: Message):
        import pyarrow as pa

        corpus = self._corpus(msg["job_id"])
        rows = []
        try:
            for s in msg["slices"]:
                name, start, end = s
                rows += corpus.read(str(name), int(start), int(end))
        except (TypeError, ValueError) as e:  # InputError included: a slice outside the corpus
            raise ProtocolError(ProtocolError.INVALID_FIELD, f"ReadTexts: {e}") from None
        self.highwater["texts_per_read"] = max(self.highwater["texts_per_read"], len(rows))
        table = pa.table({"id": pa.array([r[0] for r in rows], pa.string()),
                          "text": pa.array([r[1] for r in rows], pa.string())})
        self.counters["embed.texts_read"] += len(rows)
        return encode("Texts", {"job_id": msg["job_id"], "count": len(rows)}, {"table": table_to_ipc(table)}, reply_to=msg.id)

    def on_write(self, msg: Message):
        output = self.output(msg["job_id"])
        if output is None:
            raise ProtocolError(ProtocolError.UNKNOWN_JOB, f"job {msg['job_id']} has no embedding output")
        sb = msg["superbatch"]
        if not isinstance(sb.get("id"), str) or not isinstance(sb.get("slices"), list):
            raise ProtocolError(ProtocolError.INVALID_FIELD, "WriteEmbeddings.superbatch needs an id and slices")
        if msg["encoder"] != output.header["encoder"]:
            raise ProtocolError(ProtocolError.INVALID_FIELD, f"vectors of encoder {msg['encoder']} cannot join output "
                                f"{output.folder}, made with encoder {output.header['encoder']}")
        table = table_from_ipc(msg.blobs["table"])
        self._check_table(table, output.header, sb)
        written = output.write(sb["id"], sb["slices"], table, int(msg["truncated"]))
        self.highwater["rows_per_write"] = max(self.highwater["rows_per_write"], table.num_rows)
        self.counters["embed.superbatches_written" if written else "embed.superbatches_duplicate"] += 1
        return encode("EmbeddingsAck", {"job_id": msg["job_id"], "id": sb["id"], "written": written}, reply_to=msg.id)

    @staticmethod
    def _check_table(table, header: dict, sb: dict) -> None:
        import pyarrow as pa

        want = {"id": pa.string(), "partition": pa.string(), "row": pa.int64(),
                "vector": pa.list_(pa.float32() if header["dtype"] == "float32" else pa.float16(), header["dim"])}
        for name, kind in want.items():
            if name not in table.column_names or table.schema.field(name).type != kind:
                got = table.schema.field(name).type if name in table.column_names else "nothing"
                raise ProtocolError(ProtocolError.INVALID_FIELD, f"WriteEmbeddings: column {name!r} must be {kind}, "
                                    f"got {got} (the job's output holds dim {header['dim']} {header['dtype']})")
        rows = sum(int(e) - int(s) for _, s, e in sb["slices"])
        if table.num_rows != rows:
            raise ProtocolError(ProtocolError.INVALID_FIELD, f"WriteEmbeddings: {table.num_rows} rows for "
                                f"SuperBatch {sb['id']} of {rows}")

    def texts_done(self, job_id: str) -> int | None:
        """Texts the job's output holds; None if the job is not an embedding job."""
        output = self.output(job_id)
        return None if output is None else output.rows

    def close(self) -> None:
        for out in self.by_dir.values():
            out.close()
