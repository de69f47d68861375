"""The worker's result-writer thread: delivers what the compute and mover threads
produce — checkpoints, results, embeddings, moves — until each is acknowledged.

Results go to the job's storage node first; only once stored are they reported done to
the scheduler (`ProgressReport`), so the scheduler never counts an item a crash could
still lose. Entries come in on four queues; the thread sleeps while they are empty.
`busy()` is true while any entry is queued or taken but not yet delivered, so a
draining worker does not leave before its last result is stored.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable

import orjson

from shoal.nodes.worker.program_runner import error_record
from shoal.protocol.errors import ShoalError
from shoal.protocol.size_limits import MAX_CHECKPOINT_BYTES, MAX_RECORD_BYTES, by_size
from shoal.transport.delivery import RpcClients, deliver
from shoal.transport.rpc import DEFAULT_TIMEOUT_S

log = logging.getLogger(__name__)

WRITE_BATCH = 256  # entries taken off a queue per delivery
WRITE_TIMEOUT_S = DEFAULT_TIMEOUT_S


class _Stopped(ShoalError):
    """A delivery abandoned because the node is stopping: it was not acknowledged."""


class ResultWriter:
    def __init__(self, node_id: str, clients: RpcClients, jobs: dict, storage_of: Callable[[dict], str],
                 stored: Callable[[str, list], None], held_count: Callable[[], int], counters, stop: threading.Event,
                 encoder_fingerprint: str = "", release_superbatch: Callable | None = None):
        """`jobs`: the worker's job table (job_id -> {"storage", "report_to"}), read at
        each try so deliveries follow a moved node; `stored(job_id, ids)`: results are
        durable, the worker no longer holds them; `held()`: what the worker holds, for
        the reports."""
        self.node_id = node_id
        self.clients = clients
        self.jobs = jobs
        self.storage_of = storage_of
        self.stored = stored
        self.held_count = held_count
        self.counters = counters
        self.stop = stop
        self.encoder_fingerprint = encoder_fingerprint
        self.release_superbatch = release_superbatch
        self.results: queue.Queue = queue.Queue()  # (job_id, record, tokens)
        self.checkpoints: queue.Queue = queue.Queue()  # (job_id, {"id", "state"})
        self.moved: queue.Queue = queue.Queue()  # (job_id, seq_id, to_node)
        self.embedded: queue.Queue = queue.Queue()  # (job_id, work, Arrow IPC blob)
        self._wake = threading.Event()
        self._writing = False  # entries taken off the queues and not yet delivered
        self._results_out: list = []  # the results among them
        self._out_lock = threading.Lock()  # a result is always in the queue or in _results_out
        self._thread = threading.Thread(target=self._run, name="result-writer", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def join(self, timeout: float) -> bool:
        """After `stop` is set: waits for the thread to leave its delivery (its sockets may
        be closed only then: a zmq socket is not closed under another thread's poll).
        True when it has ended."""
        if self._thread.ident is not None:
            self._thread.join(timeout)
        return not self._thread.is_alive()

    def put(self, q: queue.Queue, entry) -> None:
        q.put(entry)
        self._wake.set()

    def unwritten(self) -> dict[str, set]:
        """job_id -> ids of the results computed here and not yet stored."""
        with self._out_lock, self.results.mutex:
            entries = [*self.results.queue, *self._results_out]
        out: dict[str, set] = {}
        for job_id, rec, _ in entries:
            out.setdefault(job_id, set()).add(rec["id"])
        return out

    def busy(self) -> bool:
        return bool(self._writing or self.results.qsize() or self.checkpoints.qsize() or self.moved.qsize()
                    or self.embedded.qsize())

    @staticmethod
    def _take(q: queue.Queue) -> list:
        batch = []
        while len(batch) < WRITE_BATCH:
            try:
                batch.append(q.get_nowait())
            except queue.Empty:
                break
        return batch

    def _run(self) -> None:
        while not self.stop.is_set():
            self._writing = True
            ckpts, moved = self._take(self.checkpoints), self._take(self.moved)
            with self._out_lock:
                batch = self._results_out = self._take(self.results)
            embedded = self._take(self.embedded)
            if not (ckpts or moved or batch or embedded):
                self._writing = False
                self._wake.wait(1.0)  # set by put: no polling while idle
                self._wake.clear()
                continue
            try:
                if ckpts:
                    self._write_checkpoints(ckpts)
                if moved:
                    self._report_moves(moved)
                if batch:
                    self._write_results(batch)
                self._results_out = []
                while embedded:
                    self._write_embeddings(*embedded[0])
                    embedded.pop(0)
            except _Stopped:  # what was not acknowledged goes back on its queue: still unwritten, still held
                self._requeue(ckpts, moved, batch, embedded)
                with self._out_lock:
                    self._results_out = []
                break
            except Exception:  # a bug here must not silently stop delivery: try again later
                self.counters["errors.writer"] += 1
                log.exception("[deliver] failed; retrying")
                self._requeue(ckpts, moved, batch, embedded)
                self.stop.wait(1.0)
        self._writing = False

    def _requeue(self, ckpts: list, moved: list, batch: list, embedded: list) -> None:
        for q, entries in ((self.checkpoints, ckpts), (self.moved, moved), (self.results, batch),
                           (self.embedded, embedded)):
            for e in entries:  # storage and the scheduler deduplicate what already went
                self.put(q, e)

    def _send(self, address: Callable[[], str | None], msg_type: str, fields: dict, what: str, blobs=None) -> None:
        reply = deliver(self.clients, address, msg_type, fields, self.stop, blobs, timeout=WRITE_TIMEOUT_S, what=what)
        if reply is None and self.stop.is_set():
            raise _Stopped(what)

    def _report(self, job: dict, fields: dict, what: str) -> None:
        self._send(lambda: job.get("report_to"), "ProgressReport",
                   {"node_id": self.node_id, **fields, "stats": {"held": self.held_count()}}, what)

    def _write_checkpoints(self, batch: list) -> None:
        by_job: dict[str, dict] = {}
        for job_id, entry in batch:  # the newest checkpoint of a sequence replaces older ones
            if len(orjson.dumps(entry)) > MAX_CHECKPOINT_BYTES:
                # It could never travel with its item; the sequence keeps its last one that could.
                self.counters["checkpoints.too_large"] += 1
                continue
            by_job.setdefault(job_id, {})[repr(entry["id"])] = entry
        for job_id, entries in by_job.items():
            job = self.jobs.get(job_id, {})
            for part in by_size(list(entries.values()), lambda e: len(orjson.dumps(e))):
                self._send(lambda: self.storage_of(job), "WriteCheckpoints", {"job_id": job_id, "checkpoints": part},
                           f"{len(part)} checkpoints of {job_id}")

    def _report_moves(self, moved: list) -> None:
        by_job: dict[str, list] = {}
        for job_id, seq_id, to_node in moved:
            by_job.setdefault(job_id, []).append([seq_id, to_node])
        for job_id, pairs in by_job.items():
            self._report(self.jobs.get(job_id, {}), {"job_id": job_id, "moved": pairs}, f"moves of {job_id}")

    def _write_results(self, batch: list) -> None:
        by_job: dict[str, list] = {}
        for job_id, rec, tokens in batch:
            size = len(orjson.dumps(rec))  # once per record: the batches below are cut by it too
            if size > MAX_RECORD_BYTES:  # re-sent forever it would stall every result behind it
                self.counters["results.too_large"] += 1
                rec = error_record(rec["id"], f"sequence {rec['id']!r}: result of {size} bytes exceeds the largest "
                                              f"result a message carries ({MAX_RECORD_BYTES} bytes)")
                size = len(orjson.dumps(rec))
            by_job.setdefault(job_id, []).append((rec, tokens, size))
        for job_id, all_entries in by_job.items():
            job = self.jobs.get(job_id, {})
            for entries in by_size(all_entries, lambda e: e[2]):
                records = [rec for rec, _, _ in entries]
                self._send(lambda: self.storage_of(job), "WriteResults", {"job_id": job_id, "records": records},
                           f"{len(records)} results of {job_id}")
                self.counters["results.written"] += len(records)
                self.stored(job_id, [r["id"] for r in records])
                if job.get("report_to"):
                    self._report(job, {"job_id": job_id, "finished": [r["id"] for r in records],
                                       "failed": [r["id"] for r in records if r.get("finish_reason") == "error"],
                                       "tokens": sum(t for _, t, _ in entries)}, f"progress of {job_id}")

    def _write_embeddings(self, job_id: str, work, blob: bytes) -> None:
        """One SuperBatch's vectors to storage, then its progress to the scheduler."""
        job = self.jobs.get(job_id, {})
        self._send(lambda: self.storage_of(job), "WriteEmbeddings",
                   {"job_id": job_id, "superbatch": {"id": work.id, "slices": work.slices},
                    "encoder": self.encoder_fingerprint, "truncated": work.truncated},
                   f"{work.id} of {job_id}", blobs={"table": blob})
        if self.release_superbatch is not None:
            self.release_superbatch(job_id, work.id)
        if job.get("report_to"):
            self._report(job, {"job_id": job_id, "finished": [work.id], "tokens": work.size}, f"progress of {job_id}")
