"""The scheduler node: one active leader, elected through etcd; standbys wait.

A thin shell around the scheduler core (`scheduler/core.py`), which makes every
decision: this node turns messages and membership into the core's events, and
`command_dispatch.py` carries out the commands it returns — reading inputs and
SuperBatch plans from storage, assigning and moving sequences on workers, logging jobs.
One thread runs the loop; nothing it sends to a worker waits for the answer.

Nothing it knows is lost with it. The job table is logged on storage (`job_log.py`); a
job's progress is its result log there (a page read with pending_only skips the items
that have results); where the other items run is what the workers report they hold.
So a newly elected leader lists the jobs, asks every worker what it holds (which also
fences the old leader off: the workers now know the new epoch), and rescans each
running job's input for the items nobody has. Every command carries the leader's epoch.
A duplicate execution (an item run twice across a takeover or a worker loss) is
harmless: storage keeps the first result of each item.
"""

from __future__ import annotations

import gc
import hashlib
import logging
import os
import threading
import time
from dataclasses import dataclass

from shoal.nodes.command_dispatch import CommandDispatch
from shoal.nodes.latency_histogram import LatencyHistogram
from shoal.nodes.leader import Election
from shoal.nodes.address_book import AddressBook
from shoal.nodes.membership import ETCD_RETRY_S, MemberView
from shoal.nodes.node import Node, node_arg_parser, parse_node_args, run_node, start_logging
from shoal.transport.outbox import Outbox, Request
from shoal.program import ProgramError, check_program_name
from shoal.protocol.codec import Message, encode
from shoal.protocol.errors import ProtocolError
from shoal.transport.delivery import RpcClients
from shoal.transport.rpc import DEFAULT_TIMEOUT_S, RemoteError
from shoal.scheduler.core import DEFAULT_SUPERBATCHES_IN_FLIGHT, SchedulerCore
from shoal.scheduler.job import EMBED, Job
from shoal.scheduler.worker_info import WorkerInfo

log = logging.getLogger(__name__)

INGEST_TIMEOUT_S = 300.0  # checking a large input file on storage takes a while
CALL_TIMEOUT_S = DEFAULT_TIMEOUT_S


@dataclass
class Takeover:
    """A rebuild of the job table under way: the workers still to say what they hold."""
    epoch: int
    started: float
    waiting: set


def job_id_for(job_key: str) -> str:
    return "j-" + hashlib.blake2b(job_key.encode(), digest_size=8).hexdigest()


def check_settings(program: str, params: dict) -> None:
    """A generation job's settings, refused here with the field named, whoever sent them:
    a bad one would otherwise fail every item on a worker."""
    from shoal.protocol.generation_settings import GENERATION_PROGRAMS
    from shoal.request_settings import GenerationSettings, SettingsError

    if program in GENERATION_PROGRAMS:
        try:
            GenerationSettings.from_wire(params)
        except SettingsError as e:
            raise ProtocolError(ProtocolError.INVALID_FIELD,
                                f"params{'.' + e.field if e.field else ''}: {e}") from None


class SchedulerNode(Node):
    role = "scheduler"

    def __init__(self, node_id: str, etcd: str, cluster: str = "default", steal: bool = True,
                 superbatches_in_flight: int = DEFAULT_SUPERBATCHES_IN_FLIGHT, **kw):
        super().__init__(node_id, etcd=etcd, cluster=cluster, **kw)
        self.election = Election(etcd, cluster, node_id)
        self.view = MemberView(etcd, cluster).start()
        self.addresses = AddressBook(self.view)  # a node restarted at a new address is found again
        self.core = SchedulerCore(steal=steal, superbatches_in_flight=superbatches_in_flight)
        self.ready_epoch = 0  # the epoch whose state this node has rebuilt; 0: none
        self.takeover: Takeover | None = None  # the rebuild under way
        self.takeover_s = 0.0  # how long the last one took
        self._workers: tuple[int, dict] = (-1, {})  # (membership version, WorkerInfo by id)
        # Decision latency: from a progress report that freed slots arriving to the next
        # assignment to that worker leaving (stats: decision_hist, latency_histogram.py).
        self.reported_at: dict[str, float] = {}
        self.decision = LatencyHistogram()
        self.clients = RpcClients(self.ctx)
        # Commands to workers go out without waiting for their acks: one slow worker
        # does not hold up the loop that answers the others' progress reports.
        self.outbox = Outbox(self.ctx)
        self.commands = CommandDispatch(self)
        threading.Thread(target=self._campaign, name="campaign", daemon=True).start()

    def _campaign(self) -> None:
        """Campaign, lead until the lease is lost (e.g. this process was frozen), step
        down, and campaign again: a node that loses leadership rejoins as a standby."""
        pause = 0.25
        while not self._stop.is_set():
            try:
                if not self.election.wait_for_leadership():
                    return
                pause = 0.25
            except Exception as e:  # etcd away: keep campaigning, at least once a second (its return is seen at once)
                log.warning("[leader] %s cannot campaign (%s); retrying in %.1f s", self.node_id, e, pause)
                time.sleep(pause)
                pause = min(pause * 2, ETCD_RETRY_S)
                continue
            while self.election.is_leader() and not self._stop.is_set():
                time.sleep(0.1)
            if not self._stop.is_set():
                log.warning("[leader] %s lost leadership (epoch %d); standing by", self.node_id, self.election.epoch)
                self.election.step_down()

    def handler_table(self) -> dict:
        return {"SubmitJob": self.on_submit, "ProgressReport": self.on_progress,
                "JobStatusQuery": self.on_status, "CancelJob": self.on_cancel,
                "DrainNode": self.on_drain, "MigrateRequest": self.on_migrate_request}

    def _leader(self) -> int:
        if not self.election.is_leader():
            raise ProtocolError(ProtocolError.NOT_LEADER, f"scheduler {self.node_id} is a standby")
        if self.ready_epoch != self.election.epoch:
            raise ProtocolError(ProtocolError.UNAVAILABLE, f"scheduler {self.node_id} is taking over; retry")
        return self.election.epoch

    def stats(self) -> dict:
        return {**super().stats(), "leader": self.election.is_leader(), "epoch": self.election.epoch,
                "takeover_s": self.takeover_s, "unacknowledged": len(self.outbox),
                "decision_hist": self.decision.snapshot(), **self.core.stats()}

    def _job(self, job_id: str) -> Job:
        job = self.core.jobs.get(job_id)
        if job is None:
            raise ProtocolError(ProtocolError.UNKNOWN_JOB, f"no job {job_id}")
        return job

    # -- talking to storage and workers ------------------------------------------------------------

    def _storage(self) -> str:
        address = self.view.storage_address()
        if address is None:
            raise ProtocolError(ProtocolError.UNAVAILABLE, "no storage node in the cluster")
        return address

    def _job_storage(self, job: Job) -> str:
        """The job's storage node where it is now (it may have restarted at a new address)."""
        job.storage = self.addresses.current(job.storage, "storage")
        return job.storage

    def _call(self, address: str, msg_type: str, fields: dict, timeout: float = CALL_TIMEOUT_S) -> Message:
        address = self.addresses.current(address)
        try:
            client = self.clients(address)
            # Everything a scheduler sends is idempotent: one lost message is re-sent.
            return client.request(msg_type, fields, timeout=timeout, retries=1)
        except RemoteError as e:
            raise ProtocolError(e.code, e.message) from None
        except TimeoutError:
            raise ProtocolError(ProtocolError.UNAVAILABLE, f"{self.addresses.name(address)} did not answer {msg_type}") from None

    def _worker_address(self, wid: str) -> str:
        worker = self.view.member("worker", wid)
        if worker is None:
            raise ProtocolError(ProtocolError.UNAVAILABLE, f"worker {wid} has left")
        return worker.info["address"]

    def _log_job(self, job: Job) -> None:
        self._call(self._job_storage(job), "LogJob", {"epoch": self.election.epoch, "job": job.record()})

    # -- handlers ----------------------------------------------------------------------------------

    def on_submit(self, msg: Message):
        epoch = self._leader()
        job_id = job_id_for(msg["job_key"])
        job = self.core.jobs.get(job_id)
        if job is not None:
            if msg["upload_id"]:  # a retried submit re-sent its upload: storage drops that copy
                self._call(self._job_storage(job), "IngestInput", {"job_id": job_id, "upload_id": msg["upload_id"], "epoch": epoch},
                           INGEST_TIMEOUT_S)
            return encode("JobAccepted", {"job_id": job_id, "job_key": msg["job_key"], "total": job.total,
                                          "duplicate": True, "detail": job.detail}, reply_to=msg.id)
        if msg["program"] == EMBED:
            return self._submit_embedding(msg, job_id, epoch)
        try:
            check_program_name(msg["program"])
        except ProgramError as e:
            raise ProtocolError(ProtocolError.INVALID_FIELD, str(e)) from None
        check_settings(msg["program"], msg["params"])
        storage = self._storage()
        # The input is checked and made durable on storage, then the job is logged there,
        # before it is accepted: an accepted job survives any node's death. Only a large
        # input (an upload, a file) is worth waiting long for.
        large = msg["upload_id"] or msg["input_path"]
        ready = self._call(storage, "IngestInput", {"job_id": job_id, "items": msg["items"], "upload_id": msg["upload_id"],
                                                     "program": msg["program"],
                                                     "input_path": msg["input_path"] or "", "epoch": epoch},
                           INGEST_TIMEOUT_S if large else CALL_TIMEOUT_S)
        job = Job(job_id, msg["job_key"], msg["program"], dict(msg["params"]), ready["total"], storage,
                  started=time.monotonic())
        self._log_job(job)
        self.core.add_job(job)
        log.info("[job] %s (%s): %d sequences", job_id, msg["job_key"], job.total)
        return encode("JobAccepted", {"job_id": job_id, "job_key": msg["job_key"], "total": job.total}, reply_to=msg.id)

    def _submit_embedding(self, msg: Message, job_id: str, epoch: int):
        """An embedding job: storage reads the corpus and opens the output (checking it
        holds nothing made differently); SuperBatches are packed from its partition list."""
        p = msg["params"]
        for key in ("b_min", "n_max"):
            if not isinstance(p.get(key), int) or isinstance(p.get(key), bool) or p[key] < 1:
                raise ProtocolError(ProtocolError.INVALID_FIELD, f"an embedding job needs {key} >= 1, got {p.get(key)!r}")
        enc = p.get("encoder")
        if not isinstance(enc, dict) or not enc.get("fingerprint") or not isinstance(enc.get("dim"), int):
            raise ProtocolError(ProtocolError.INVALID_FIELD, "an embedding job needs its encoder's fingerprint and dim")
        storage = self._storage()
        ready = self._call(storage, "IngestCorpus", {
            "epoch": epoch, "job_id": job_id, "corpus": p.get("corpus") or {}, "output": str(p.get("output") or ""),
            "header": {"encoder": enc["fingerprint"], "encoder_name": enc.get("name", ""), "dim": enc["dim"],
                       "dtype": p.get("vector_dtype", "float32"), "packing": [p["b_min"], p["n_max"]]}},
            INGEST_TIMEOUT_S)
        job = Job(job_id, msg["job_key"], EMBED, dict(p), ready["total"], storage, started=time.monotonic())
        job.detail = {k: ready[k] for k in ("partitions", "skipped", "errors", "empty", "done")}
        self._log_job(job)
        self.core.add_job(job)
        log.info("[job] %s (%s): embed %d texts in %d partitions (%d already in the output)", job_id, msg["job_key"],
                 job.total, ready["partitions"], ready["done"])
        return encode("JobAccepted", {"job_id": job_id, "job_key": msg["job_key"], "total": job.total,
                                      "detail": job.detail}, reply_to=msg.id)

    def on_progress(self, msg: Message):
        epoch = self._leader()
        self.core.progress(msg["node_id"], msg["job_id"], msg["finished"], msg["moved"],
                           int(msg["stats"].get("held", 0)), msg["tokens"])
        if msg["finished"]:  # slots freed: the time to the worker's next assignment is measured
            self.reported_at.setdefault(msg["node_id"], self.received_at)
        return encode("ProgressAck", {"epoch": epoch}, reply_to=msg.id)

    def on_status(self, msg: Message):
        self._leader()
        return encode("JobStatus", self._job(msg["job_id"]).status(time.monotonic()), reply_to=msg.id)

    def on_cancel(self, msg: Message):
        self._leader()
        job = self._job(msg["job_id"])
        drops = self.core.cancel(job.job_id)
        if job.state == "cancelled":  # again on a repeated cancel: a write that failed is retried
            self._log_job(job)
        self.commands.run(drops)  # after the log: a new leader never places again what workers dropped
        return encode("JobStatus", job.status(time.monotonic()), reply_to=msg.id)

    def on_drain(self, msg: Message):
        """Stop placing work on a worker, move what it holds to the others (a little
        every tick, as they have room); the worker leaves when it holds nothing."""
        epoch = self._leader()
        wid = msg["node_id"]
        worker = self.view.member("worker", wid)
        if worker is None:
            raise ProtocolError(ProtocolError.INVALID_FIELD, f"no worker {wid!r} in the cluster")
        self._call(worker.info["address"], "DrainWorker", {"epoch": epoch})
        held = self.core.drain(wid)
        log.info("[drain] %s: draining, %d sequences to move", wid, held)
        return encode("OpsAck", {"detail": {"node_id": wid, "held": held}}, reply_to=msg.id)

    def on_migrate_request(self, msg: Message):
        """Moves a job's sequences (all, or the listed ones) to one worker."""
        self._leader()
        job = self._job(msg["job_id"])
        if msg["to_node"] not in self.view.snapshot("worker"):
            raise ProtocolError(ProtocolError.INVALID_FIELD, f"no worker {msg['to_node']!r} in the cluster")
        moves = self.core.migrate(job.job_id, msg["to_node"], msg["seq_ids"])
        for m in moves:
            self.commands.execute(m, quiet=False, wait=True)
        return encode("OpsAck", {"detail": {"moving": sum(len(m.seq_ids) for m in moves),
                                            "from": {m.source: len(m.seq_ids) for m in moves}}}, reply_to=msg.id)

    # -- takeover ----------------------------------------------------------------------------------

    def _begin_takeover(self) -> None:
        """Rebuilds the job table for this epoch: the job log from storage, then what
        each worker holds, asked of all at once (answers come in on later turns of the
        loop). Until it is done, requests get 'unavailable' and clients retry."""
        epoch = self.election.epoch
        self.core.reset()
        storage = self._storage()
        started = time.monotonic()
        listing = self._call(storage, "ListJobs", {"epoch": epoch}, 30.0)
        for rec in listing["jobs"]:
            job = Job(rec["job_id"], rec["job_key"], rec["program"], rec["params"], rec["total"], storage, rec["state"],
                      started=time.monotonic())
            job.done, job.detail = rec["done"], rec.get("detail") or {}
            self.core.add_job(job)
        workers = self.view.snapshot("worker")
        takeover = self.takeover = Takeover(epoch, started, set(workers))
        for wid, w in workers.items():
            def answered(reply, wid=wid, info=w.info):
                if self.takeover is takeover:
                    self.commands.run(self.core.holding(WorkerInfo.from_member(wid, info), reply["jobs"]))
                    takeover.waiting.discard(wid)

            def unanswered(reply, wid=wid) -> bool:
                # Its sequences are found again by the rescan of every running job's input.
                log.warning("[takeover] worker %s did not say what it holds (%s)", wid,
                            f"{reply['code']}: {reply['message']}" if reply is not None else "no answer")
                takeover.waiting.discard(wid)
                return True

            address = w.info["address"]
            self.outbox.send(Request(lambda a=address: a, "HoldingQuery", {"epoch": epoch, "report_to": self.advertise},
                                     answered, unanswered, max_tries=2))

    def _finish_takeover(self) -> None:
        epoch = self.takeover.epoch
        self.ready_epoch = epoch
        self.takeover_s = time.monotonic() - self.takeover.started
        self.takeover = None
        running = [j for j in self.core.jobs.values() if j.running]
        log.info("[takeover] epoch %d in %.2f s: %d jobs (%d running), %d sequences held by workers", epoch,
                 self.takeover_s, len(self.core.jobs), len(running), sum(len(j.placed) for j in running))

    # -- the core's periodic decisions, carried out --------------------------------------------------

    def tick(self) -> None:
        if not self.election.is_leader():
            if self.ready_epoch or self.takeover is not None:
                self.ready_epoch = 0  # a standby now: the next leader owns the table
                self.takeover = None
                self.core.reset()
            return
        if self.ready_epoch != self.election.epoch:
            if self.takeover is None or self.takeover.epoch != self.election.epoch:
                try:
                    self._begin_takeover()
                except ProtocolError as e:
                    self.takeover = None
                    log.warning("[takeover] not yet: %s", e)
                    time.sleep(0.5)
            elif not self.takeover.waiting:
                self._finish_takeover()
            return
        if self._workers[0] != self.view.version:  # rebuilt only when membership changed
            version = self.view.version
            self._workers = (version, {wid: WorkerInfo.from_member(wid, w.info)
                                       for wid, w in self.view.snapshot("worker").items()})
        self.core.update_workers(self._workers[1])
        self.commands.run(self.core.tick(time.monotonic()))

    def close(self) -> None:
        self.election.resign()
        self.view.stop()
        super().close()


def main(argv: list[str] | None = None) -> int:
    ap = node_arg_parser("scheduler", etcd_required=True)
    ap.add_argument("--no-steal", action="store_true",
                    help="never move sequences from a loaded worker to an idle one (work stealing is on by default)")
    ap.add_argument("--superbatches-in-flight", type=int, default=DEFAULT_SUPERBATCHES_IN_FLIGHT,
                    help="SuperBatches of embedding jobs a worker holds at once (its memory bound: this many "
                         "times B_min + n_max texts)")
    args = parse_node_args(ap, argv)
    if args.superbatches_in_flight < 1:
        ap.error("--superbatches-in-flight must be at least 1")
    node_id = args.node_id or f"scheduler-{os.getpid()}"
    start_logging("scheduler", node_id)
    # The job table holds hundreds of thousands of live containers (items read ahead,
    # placements); a full cycle collection walks them all (157 ms measured at 128
    # workers) while every decision waits. Full collections a hundred times rarer: the
    # table's objects are freed by reference counting, not by the cycle collector.
    gc.set_threshold(700, 10, 1000)
    node = SchedulerNode(node_id, args.etcd, args.cluster, steal=not args.no_steal,
                         superbatches_in_flight=args.superbatches_in_flight, bind=args.bind,
                         advertise=args.advertise)
    return run_node(node, args.metrics_port, args.metrics_host)

if __name__ == "__main__":
    raise SystemExit(main())
