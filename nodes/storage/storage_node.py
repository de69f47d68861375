"""The storage node: job inputs and results on local disk.

Inputs arrive inline, in chunks or by path and are checked once (`input_store.py`);
the scheduler reads them in pages. Results are written through a WAL with group
commit, first writer wins, served back from resumable offsets, and compacted into
JSONL and Parquet shards once every item of the job has its result. Sequence
checkpoints (`checkpoint_store.py`) ride along with the items placed again.

Durability domain: this node's disk. A WriteAck is sent only after the fsync that
covers its records, so an acknowledged result survives a crash of any process.

A full disk is a state (`disk_space.py`): writes are refused with `disk_full`, naming
the directory and its free bytes, while reads go on; a commit the disk has no room for
is rolled back and its writes refused the same way, so nothing refused was acknowledged
and the senders, who keep what they sent, try again until space is freed.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import NamedTuple

import orjson
from shoal.generate_input import MAX_ITEM_BYTES, InputError
from shoal.nodes.storage.checkpoint_store import CheckpointStore
from shoal.nodes.storage.disk_space import DEFAULT_RESERVE_BYTES, DiskSpace, is_out_of_space
from shoal.nodes.data_roots import DataRoots
from shoal.nodes.storage.embedding_jobs import EmbeddingJobs
from shoal.nodes.storage.index_service import IndexService
from shoal.nodes.storage.search_server import SearchServer
from shoal.nodes.storage.input_store import InputStore, check_name
from shoal.nodes.storage.job_log import JobLog, StaleEpoch
from shoal.nodes.process_memory import give_back_memory, map_large_buffers_apart
from shoal.nodes.storage.parked_reads import MAX_WAIT_S, ParkedRead, ParkedReads
from shoal.nodes.node import Node, add_data_root_arg, data_roots_of, lasting_node_id, node_arg_parser, parse_node_args, run_node, start_logging
from shoal.nodes.storage.result_compaction import compact_in_child
from shoal.nodes.storage.finished_results import FinishedResults
from shoal.nodes.storage.result_log import ResultLog
from shoal.protocol.codec import MAX_HEADER_BYTES, Message, encode
from shoal.protocol.errors import ProtocolError
from shoal.protocol.size_limits import BATCH_BYTES

log = logging.getLogger(__name__)

READ_LIMIT = 1000  # records per ResultBatch
INPUT_PAGE_BYTES = BATCH_BYTES  # items (and checkpoints) travel in the header: under its cap
COMPACTION_RETRY_S = 30.0  # a job whose shards the disk had no room for is compacted again after this
UPLOAD_SWEEP_S = 3600.0  # how often abandoned uploads are looked for


class AfterCommit(NamedTuple):
    """A write's reply, sent only once the batch's commit of `log` (a key of
    StorageNode._commit_logs) has made its records durable; an Error if it failed."""

    reply: list
    log: tuple
    msg: Message


class _NoResults:
    """A job with no results on this node, as a read sees it."""

    failed = 0

    def __len__(self) -> int:
        return 0

    def __contains__(self, item_id) -> bool:
        return False

    def read(self, offset: int, limit: int, max_bytes: int | None = None) -> list:
        return []


class StorageNode(Node):
    role = "storage"
    # Results and checkpoints are first-writer-wins by id and the job log is fenced by
    # the leader's epoch, so storage takes writes and serves reads through an etcd
    # outage: the workers' finished results land meanwhile, and readers keep reading.
    serves_without_lease = True

    def __init__(self, node_id: str, data_dir: str | Path, max_item_bytes: int = MAX_ITEM_BYTES,
                 data_roots: list[str] | None = None, reserve_bytes: int = DEFAULT_RESERVE_BYTES, **kw):
        """`data_roots`: the folders a request may name paths in (input files, corpora,
        embedding outputs, indexes); None: nowhere. `reserve_bytes`: writes are refused
        (`disk_full`) while the data directory's filesystem has less free."""
        self.dir = Path(data_dir)
        self.disk = DiskSpace(node_id, self.dir, reserve_bytes)
        self.data_roots = DataRoots(data_roots or [])
        self.logs: dict[str, ResultLog] = {}
        self.checkpoints: dict[str, CheckpointStore] = {}
        self.inputs = InputStore(self.dir, max_item_bytes)
        self._uploads_swept = 0.0  # when abandoned uploads were last looked for (at start, then hourly)
        self.job_log = JobLog(self.dir / "control" / "jobs.jsonl")
        self.compacted: set[str] = {p.parent.name for p in (self.dir / "jobs").glob("*/results.jsonl")}
        self._compactions: list[threading.Thread] = []
        self._finished: dict[str, FinishedResults] = {}  # compacted on a thread, not yet swapped in
        self._finished_lock = threading.Lock()
        self._unsharded: dict[str, float] = {}  # finished jobs whose shards the disk had no room for -> when
        self.embedding = EmbeddingJobs(self.dir, data_roots=self.data_roots)
        self.parked = ParkedReads()  # Subscribes waiting for their job (`wait_ms`)
        self.indexes = IndexService(self.dir, None, data_roots=self.data_roots)
        super().__init__(node_id, info={"indexes": self.indexes.published()}, **kw)
        self.embedding.counters = self.indexes.counters = self.counters
        self.search = SearchServer(self, self.indexes.on_search, kw.get("bind", "tcp://127.0.0.1:0"), self.advertise)
        if self.registration is not None:
            self.registration.publish(search_address=self.search.address)
            self.indexes.publish = lambda indexes: self.registration.publish(indexes=indexes)

    def handler_table(self) -> dict:
        table = {"WriteResults": self.on_write_results, "WriteCheckpoints": self.on_write_checkpoints, "Subscribe": self.on_subscribe,
                 "UploadChunk": self.on_upload_chunk, "IngestInput": self.on_ingest, "ReadInput": self.on_read_input,
                 "LogJob": self.on_log_job, "ListJobs": self.on_list_jobs, "ResultCountQuery": self.on_result_count,
                 **self.embedding.handlers(), **self.indexes.handlers()}
        # What fills the disk is refused while it is full; the job log's rare state
        # changes write into the reserve, and reads go on.
        for name in ("WriteResults", "WriteCheckpoints", "UploadChunk", "IngestInput", "IngestCorpus", "WriteEmbeddings"):
            table[name] = self._when_there_is_room(table[name])
        return table

    def _when_there_is_room(self, handler):
        def guarded(msg: Message):
            self.disk.check()
            return handler(msg)

        return guarded

    def failed(self, msg: Message, e: Exception) -> list:
        if is_out_of_space(e):  # a write the kernel refused: a state to report, not a bug
            e = self.disk.refused(e)
        return super().failed(msg, e)

    def _fence(self, epoch: int) -> None:
        try:
            self.job_log.check_epoch(epoch)
        except StaleEpoch as e:
            self.counters["errors.stale_epoch"] += 1
            raise ProtocolError(ProtocolError.STALE_EPOCH, str(e)) from None

    # -- the job log -------------------------------------------------------------------------

    def on_log_job(self, msg: Message):
        self._fence(msg["epoch"])
        try:
            self.job_log.record(msg["job"], msg["epoch"])
        except ValueError as e:
            raise ProtocolError(ProtocolError.INVALID_FIELD, str(e)) from None
        job = self.job_log.jobs[msg["job"]["job_id"]]
        return encode("JobLogged", {"job_id": job["job_id"], "state": job["state"]}, reply_to=msg.id)

    def on_list_jobs(self, msg: Message):
        self._fence(msg["epoch"])
        jobs = []
        for rec in self.job_log.jobs.values():
            rl = self._log(rec["job_id"], create=False)
            texts = self.embedding.texts_done(rec["job_id"])  # an embedding job's progress is its output
            jobs.append({**rec, "done": len(rl) if texts is None else texts, "failed": rl.failed})
        return encode("JobList", {"jobs": jobs}, reply_to=msg.id)

    def on_result_count(self, msg: Message):
        rl = self._log(msg["job_id"], create=False)
        texts = self.embedding.texts_done(msg["job_id"])
        return encode("ResultCount", {"job_id": msg["job_id"], "records": len(rl) if texts is None else texts,
                                      "failed": rl.failed}, reply_to=msg.id)

    # -- inputs ------------------------------------------------------------------------------

    def on_upload_chunk(self, msg: Message):
        data = msg.blobs["data"]
        try:
            self.inputs.put_chunk(msg["upload_id"], msg["index"], bytes(data))
        except InputError as e:
            raise ProtocolError(ProtocolError.BAD_INPUT, str(e)) from None
        self.counters["upload.bytes"] += len(data)
        return encode("UploadAck", {"upload_id": msg["upload_id"], "index": msg["index"], "bytes": len(data)},
                      reply_to=msg.id)

    def on_ingest(self, msg: Message):
        self._fence(msg["epoch"])
        # The path as checked (links resolved) is the one opened: a link changed after the check is not followed.
        input_path = str(self.data_roots.check(msg["input_path"], "input file")) if msg["input_path"] else ""
        try:
            total = self.inputs.ingest(check_name("job_id", msg["job_id"]), msg["items"], msg["upload_id"],
                                       input_path, msg["program"])
        except InputError as e:
            raise ProtocolError(ProtocolError.BAD_INPUT, str(e)) from None
        log.info("[input] %s: %d items stored", msg["job_id"], total)
        if msg["upload_id"] or input_path:  # a large input passed through: what it took goes back
            give_back_memory()
        return encode("InputReady", {"job_id": msg["job_id"], "total": total}, reply_to=msg.id)

    def on_read_input(self, msg: Message):
        if msg["offset"] < 0 or msg["limit"] <= 0:
            raise ProtocolError(ProtocolError.INVALID_FIELD, "ReadInput needs offset >= 0 and limit > 0")
        keep = extra = None
        if msg["pending_only"]:
            rl = self._log(msg["job_id"], create=False)
            keep = lambda item: item["id"] not in rl  # noqa: E731 - items without a result yet
            store = self._checkpoints(msg["job_id"])
            extra = lambda item: len(orjson.dumps(store.get(item["id"])))  # noqa: E731
        try:
            items, nxt = self.inputs.read(check_name("job_id", msg["job_id"]), msg["offset"], msg["limit"],
                                          INPUT_PAGE_BYTES, keep, extra=extra)
        except InputError as e:
            raise ProtocolError(ProtocolError.BAD_INPUT, str(e)) from None
        fields = {"job_id": msg["job_id"], "offset": msg["offset"], "items": items, "next_offset": nxt}
        if msg["pending_only"]:  # items to place again: each restarts from its last checkpoint
            fields["checkpoints"] = [store.get(item["id"]) for item in items]
        return encode("InputBatch", fields, reply_to=msg.id)

    # -- results -----------------------------------------------------------------------------

    def _log(self, job_id: str, create: bool = True) -> "ResultLog | _NoResults":
        """The job's result log; a read (`create=False`) of a job with none gets an
        empty view, so a mistyped job id leaves no files behind."""
        try:
            check_name("job_id", job_id)
        except InputError as e:
            raise ProtocolError(ProtocolError.INVALID_FIELD, str(e)) from None
        if job_id not in self.logs:
            path = self.dir / "jobs" / job_id / "results.wal"
            if not create and not path.exists():
                return _NoResults()
            # A job compacted before this process started is finished: its compact view.
            self.logs[job_id] = FinishedResults(path) if job_id in self.compacted else ResultLog(path)
        return self.logs[job_id]

    def _checkpoints(self, job_id: str) -> CheckpointStore:
        if job_id not in self.checkpoints:
            self.checkpoints[job_id] = CheckpointStore(self.dir / "jobs" / job_id / "checkpoints.jsonl")
        return self.checkpoints[job_id]

    def on_write_checkpoints(self, msg: Message):
        entries = msg["checkpoints"]
        bad = next((e for e in entries if not isinstance(e, dict) or "id" not in e or not isinstance(e.get("state"), dict)), None)
        if bad is not None:
            raise ProtocolError(ProtocolError.INVALID_FIELD, f"checkpoint without an id or a state: {str(bad)[:60]}")
        rl = self._log(msg["job_id"], create=False)
        kept = self._checkpoints(msg["job_id"]).record(entries, lambda i: i in rl)
        self.counters["checkpoints.kept"] += kept
        return AfterCommit(encode("CheckpointAck", {"job_id": msg["job_id"], "kept": kept}, reply_to=msg.id),
                           ("checkpoints", msg["job_id"]), msg)

    def on_write_results(self, msg: Message):
        records = msg["records"]
        bad = next((r for r in records if not isinstance(r, dict) or "id" not in r), None)
        if bad is not None:
            raise ProtocolError(ProtocolError.INVALID_FIELD, f"result record without an id: {str(bad)[:60]}")
        written, dup = self._log(msg["job_id"]).append(records)
        ckpts = self.checkpoints.get(msg["job_id"])
        if ckpts is not None:
            for r in records:
                ckpts.forget(r["id"])
        self.counters["records.written"] += written
        self.counters["records.duplicate"] += dup
        # Sent after the commit, even for duplicates only: the first copy may be in this
        # very commit, which the disk can still refuse.
        return AfterCommit(encode("WriteAck", {"job_id": msg["job_id"], "written": written, "duplicates": dup},
                                  reply_to=msg.id), ("results", msg["job_id"]), msg)

    def on_subscribe(self, msg: Message):
        if msg["offset"] < 0 or msg["wait_ms"] < 0:
            raise ProtocolError(ProtocolError.INVALID_FIELD, "offset and wait_ms must be >= 0")
        rl = self._log(msg["job_id"], create=False)
        if msg["wait_ms"] and not self._read_ready(msg, rl) and not self.parked.full():
            return ParkedRead(msg, time.monotonic() + min(msg["wait_ms"] / 1000, MAX_WAIT_S))
        return self._result_batch(msg, rl)

    def _complete(self, job_id: str, rl) -> bool:
        """Every item of the job has its result here."""
        total = self.inputs.total(job_id)
        return total is not None and len(rl) >= total

    def _read_ready(self, msg: Message, rl) -> bool:
        """A waiting read is answered early when the job is complete or a full batch is there."""
        return len(rl) - msg["offset"] >= READ_LIMIT or self._complete(msg["job_id"], rl)

    def _result_batch(self, msg: Message, rl) -> list:
        records = rl.read(msg["offset"], READ_LIMIT, BATCH_BYTES)  # the header's cap, not a count, bounds it
        final = msg["offset"] + len(records) >= len(rl) and self._complete(msg["job_id"], rl)
        return encode("ResultBatch", {"job_id": msg["job_id"], "offset": msg["offset"], "records": records,
                                      "final": final, "available": len(rl),
                                      "disk_full": "" if final else self.disk.problem()}, reply_to=msg.id)

    def handle_batch(self, batch) -> None:
        """Group commit: every WriteResults that arrived together shares one fsync per
        job log, and their acks go out only after it. Reads waiting on a job that now
        has its answer are answered after the commit too."""
        replies = []
        for identity, frames in batch:
            reply = self.dispatch(frames)
            if isinstance(reply, ParkedRead):
                reply.identity = identity
                self.parked.park(reply.msg["job_id"], reply)
                continue
            replies.append((identity, reply))
        refused = self._commit_logs()
        for identity, reply in replies:
            if isinstance(reply, AfterCommit):
                e = refused.get(reply.log)
                reply = reply.reply if e is None else self.failed(reply.msg, e)
            if reply is not None:
                self.send(identity, reply)
        for job_id in self.parked.jobs():
            rl = self._log(job_id, create=False)
            self._answer(self.parked.take(job_id, lambda r: self._read_ready(r.msg, rl)))
        self._compact_finished()

    def _commit_logs(self) -> dict[tuple, Exception]:
        """Commits every log written in this batch; returns the errors of those whose
        commit failed (rolled back: their writes are refused, not acknowledged)."""
        refused = {}
        for kind, logs in (("results", self.logs), ("checkpoints", self.checkpoints)):
            for job_id, log_ in logs.items():
                try:
                    log_.commit()
                except OSError as e:
                    self.counters["errors.commit"] += 1
                    log.warning("[commit] %s of %s refused: %s", kind, job_id, e)
                    refused[(kind, job_id)] = e if is_out_of_space(e) else ProtocolError(
                        ProtocolError.UNAVAILABLE, f"{self.node_id} could not write {kind} of {job_id}: {e}")
        return refused

    def tick(self) -> None:
        self._answer(r for _, r in self.parked.take_due(time.monotonic()))
        self._shard_again()
        if time.monotonic() - self._uploads_swept > UPLOAD_SWEEP_S or not self._uploads_swept:
            self._uploads_swept = time.monotonic()  # on a thread: a large leftover takes a while to delete
            threading.Thread(target=self._sweep_uploads, name="upload-sweep", daemon=True).start()

    def _sweep_uploads(self) -> None:
        if removed := self.inputs.sweep_uploads():
            log.info("[input] removed %d uploads abandoned part-way", removed)

    def poll_timeout_ms(self) -> int:
        deadline = self.parked.next_deadline()
        if deadline is None:
            return super().poll_timeout_ms()
        return max(0, min(super().poll_timeout_ms(), int(1000 * (deadline - time.monotonic())) + 1))

    def _answer(self, reads) -> None:
        for r in reads:
            try:
                reply = self._result_batch(r.msg, self._log(r.msg["job_id"], create=False))
            except Exception as e:  # a read that fails now gets its Error, like any other request
                reply = self.failed(r.msg, e)
            self.send(r.identity, reply)

    def _compact_finished(self) -> None:
        """Every job whose log holds a result for each input item gets its shards, once,
        on a thread (the log no longer changes: later writes are all duplicates); then
        its per-item state is dropped for a compact view (`finished_results.py`)."""
        with self._finished_lock:
            finished, self._finished = self._finished, {}
        for job_id, view in finished.items():
            old, self.logs[job_id] = self.logs.get(job_id), view
            if old is not None:
                old.close()
            self.inputs.forget(job_id)
        if finished:
            give_back_memory()
        for job_id, rl in self.logs.items():
            if job_id in self.compacted:
                continue
            if self._complete(job_id, rl):
                self.compacted.add(job_id)
                store = self.checkpoints.pop(job_id, None)
                if store is not None:  # every sequence has its result: no restart can need them
                    store.close()
                    store.path.unlink(missing_ok=True)
                t = threading.Thread(target=self._compact, args=(job_id, rl.path, rl), name=f"compact-{job_id}",
                                     daemon=True)
                t.start()
                self._compactions.append(t)

    def _shard_again(self) -> None:
        """Finished jobs whose shards the disk had no room for are compacted again once
        it has (their results are read from the log meanwhile)."""
        now = time.monotonic()
        with self._finished_lock:
            due = [j for j, at in self._unsharded.items() if now - at >= COMPACTION_RETRY_S]
        if not due or self.disk.problem():
            return
        for job_id in due:
            with self._finished_lock:
                self._unsharded.pop(job_id, None)
            wal = self.dir / "jobs" / job_id / "results.wal"
            t = threading.Thread(target=self._compact, args=(job_id, wal), name=f"compact-{job_id}", daemon=True)
            t.start()
            self._compactions.append(t)

    def _compact(self, job_id: str, wal: Path, rl: ResultLog | None = None) -> None:
        try:
            written = compact_in_child(wal)
        except OSError as e:  # a full disk: the job is finished all the same, its results read from the log
            log.warning("[compact] %s: no shards yet (%s); trying again once there is room", job_id, e)
            written = None
            with self._finished_lock:
                self._unsharded[job_id] = time.monotonic()
        except Exception as e:  # noqa: BLE001 - a bug or a bad record: the results stand in the log all the same
            log.error("[compact] %s: no shards (%s)", job_id, e)
            written = None
        # Built here, off the loop (a log whose job ran in this process lends its offsets);
        # swapped in by the loop.
        view = FinishedResults(wal, rl if isinstance(rl, ResultLog) else None)
        with self._finished_lock:
            self._finished[job_id] = view
        if written is not None:
            self.counters["jobs.compacted"] += 1
            log.info("[compact] %s: %s", job_id, ", ".join(written.values()))

    def close(self) -> None:
        self.search.close()
        for t in self._compactions:
            t.join(timeout=30)
        for rl in self.logs.values():
            rl.close()
        for store in self.checkpoints.values():
            store.close()
        self.job_log.close()
        self.embedding.close()
        super().close()

    def stats(self) -> dict:
        running = [rl for rl in self.logs.values() if isinstance(rl, ResultLog)]
        return {**super().stats(), "highwater": dict(self.embedding.highwater), "disk": self.disk.state(),
                # What storage's memory follows: the results of jobs still running.
                "result_logs": {"running": len(running), "finished": len(self.logs) - len(running),
                                "resident_ids": sum(len(rl.ids) for rl in running)}}


def main(argv: list[str] | None = None) -> int:
    ap = node_arg_parser("storage")
    ap.add_argument("--dir", required=True, help="the node's data directory")
    ap.add_argument("--max-item-bytes", type=int, default=MAX_ITEM_BYTES,
                    help="largest job item taken, as compact JSON; a larger one is refused, naming its line "
                         f"(at most {MAX_HEADER_BYTES // 2}: items travel in message headers)")
    ap.add_argument("--min-free-mb", type=float, default=DEFAULT_RESERVE_BYTES / 2**20,
                    help="writes are refused (disk_full, naming this directory) while its filesystem has less free; "
                         "reads go on, and the writes are taken again once space is freed")
    add_data_root_arg(ap)
    args = parse_node_args(ap, argv)
    if not 0 < args.max_item_bytes <= MAX_HEADER_BYTES // 2:
        ap.error(f"--max-item-bytes must be in [1, {MAX_HEADER_BYTES // 2}], got {args.max_item_bytes}")
    node_id = lasting_node_id(args.dir, "storage", args.node_id)
    start_logging("storage", node_id)
    map_large_buffers_apart()
    roots = data_roots_of(args)
    node = StorageNode(node_id, args.dir, max_item_bytes=args.max_item_bytes, data_roots=roots, bind=args.bind, etcd=args.etcd,
                       cluster=args.cluster, advertise=args.advertise, reserve_bytes=int(args.min_free_mb * 2**20))
    return run_node(node, args.metrics_port, args.metrics_host)

if __name__ == "__main__":
    raise SystemExit(main())
