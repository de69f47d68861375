"""The scheduler node: one active leader, elected through etcd; standbys wait.

It owns the job table and where every sequence runs: it reads a job's items from
storage in pages as workers have room, places them (`scheduler/placement.py`), and
learns from the workers' batched progress reports which ones are stored.

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

import hashlib
import logging
import os
import threading
import time
from collections import deque
from dataclasses import dataclass, field

import orjson

from shoal.nodes.leader import Election
from shoal.nodes.address_book import AddressBook
from shoal.nodes.membership import MemberView
from shoal.nodes.node import Node, node_arg_parser, parse_node_args, run_node, start_logging
from shoal.program import ProgramError, check_program_name
from shoal.protocol.codec import Message, encode
from shoal.protocol.errors import ProtocolError
from shoal.protocol.size_limits import by_size
from shoal.rpc import DEFAULT_TIMEOUT_S, RemoteError, RpcClient
from shoal.scheduler.placement import PendingSeq, WorkerLoad, place
from shoal.scheduler.rebalance import Move, plan_drain, plan_steals
from shoal.scheduler.superbatch import pack

EMBED = "embed"  # the program name of bulk embedding jobs: SuperBatches, not sequences
DEFAULT_SUPERBATCHES_IN_FLIGHT = 2  # per worker: one encoding, one being read

log = logging.getLogger(__name__)

DEFAULT_MAX_HELD = 256
INPUT_PAGE = 512  # items per ReadInput
INGEST_TIMEOUT_S = 300.0  # checking a large input file on storage takes a while
CALL_TIMEOUT_S = DEFAULT_TIMEOUT_S


@dataclass
class Job:
    """A job as the scheduler sees it. Its items stay on storage: the scheduler holds
    only those pending (read, on no worker) and which worker holds which."""

    job_id: str
    job_key: str
    program: str
    params: dict  # the program's arguments (for `generate`: sampling parameters)
    total: int
    storage: str  # the storage node's address: inputs, results, the job log
    state: str = "running"
    cursor: int = 0  # next input position to read (pending items only)
    pending: deque = field(default_factory=deque)  # assignments read but on no worker
    pending_ids: set = field(default_factory=set)
    placed: dict = field(default_factory=dict)  # seq_id -> worker id
    done: int = 0  # results stored (storage's count at takeover + reports since)
    tokens: int = 0
    started: float = field(default_factory=time.monotonic)
    finished_at: float | None = None
    detail: dict = field(default_factory=dict)  # what ingest found (an embedding job's bad rows, ...)
    superbatches: dict | None = None  # an embedding job's: id -> {id, slices, size}, once planned

    @property
    def embedding(self) -> bool:
        return self.program == EMBED

    def weight(self, sid) -> int:
        """What finishing `sid` adds to `done`: a sequence counts 1, a SuperBatch its texts."""
        if not self.embedding:
            return 1
        return (self.superbatches or {}).get(sid, {}).get("size", 0)

    def record(self) -> dict:
        return {"job_id": self.job_id, "job_key": self.job_key, "program": self.program, "params": self.params,
                "total": self.total, "state": self.state, "detail": self.detail}

    def status(self) -> dict:
        elapsed = (self.finished_at or time.monotonic()) - self.started
        return {"job_id": self.job_id, "state": self.state, "total": self.total, "done": self.done,
                "tokens_per_s": self.tokens / max(elapsed, 1e-9), "detail": self.detail}

    def assignment(self, item: dict, state: dict | None = None) -> dict:
        # The item goes as it is: the job's program reads its fields on the worker. A
        # sequence placed again goes with its last checkpoint, to restart from there.
        a = {"seq_id": item["id"], "item": item}
        if state:
            a["state"] = state
        return a

    def rescan(self) -> None:
        """Read the input again from the start (only items without results come back):
        after a takeover or a lost worker, whatever nobody holds is found again."""
        self.cursor = 0


def job_id_for(job_key: str) -> str:
    return "j-" + hashlib.blake2b(job_key.encode(), digest_size=8).hexdigest()


class SchedulerNode(Node):
    role = "scheduler"

    def __init__(self, node_id: str, etcd: str, cluster: str = "default", steal: bool = True,
                 superbatches_in_flight: int = DEFAULT_SUPERBATCHES_IN_FLIGHT, **kw):
        super().__init__(node_id, etcd=etcd, cluster=cluster, **kw)
        self.election = Election(etcd, cluster, node_id)
        self.view = MemberView(etcd, cluster).start()
        self.addresses = AddressBook(self.view)  # a node restarted at a new address is found again
        self.jobs: dict[str, Job] = {}
        self.ready_epoch = 0  # the epoch whose state this node has rebuilt; 0: none
        self.held: dict[str, int] = {}  # worker -> sequences it holds (last report)
        self.incarnations: dict[str, object] = {}  # worker -> the lease it registered under
        self.clients: dict[str, RpcClient] = {}
        self.steal = steal
        self.superbatches_in_flight = superbatches_in_flight
        self.draining: set[str] = set()  # workers being emptied; they get no new work
        self.moving: dict[str, float] = {}  # worker -> deadline of a move it is part of
        threading.Thread(target=self._campaign, name="campaign", daemon=True).start()

    def _campaign(self) -> None:
        """Campaign, lead until the lease is lost (e.g. this process was frozen), step
        down, and campaign again: a node that loses leadership rejoins as a standby."""
        pause = 0.5
        while not self._stop.is_set():
            try:
                if not self.election.wait_for_leadership():
                    return
                pause = 0.5
            except Exception as e:  # etcd away: keep campaigning, with capped backoff
                log.warning("[leader] %s cannot campaign (%s); retrying in %.1f s", self.node_id, e, pause)
                time.sleep(pause)
                pause = min(pause * 2, 5.0)
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
            raise ProtocolError("not_leader", f"scheduler {self.node_id} is a standby")
        if self.ready_epoch != self.election.epoch:
            raise ProtocolError("unavailable", f"scheduler {self.node_id} is taking over; retry")
        return self.election.epoch

    def stats(self) -> dict:
        jobs = {j.job_id: {"state": j.state, "total": j.total, "done": j.done, "pending": len(j.pending),
                           "placed": len(j.placed)} for j in self.jobs.values()}
        return {**super().stats(), "leader": self.election.is_leader(), "epoch": self.election.epoch, "jobs": jobs,
                "held": dict(self.held)}

    # -- talking to storage and workers ------------------------------------------------------------

    def _storage(self) -> str:
        address = self.view.storage_address()
        if address is None:
            raise ProtocolError("unavailable", "no storage node in the cluster")
        return address

    def _job_storage(self, job: Job) -> str:
        """The job's storage node where it is now (it may have restarted at a new address)."""
        job.storage = self.addresses.current(job.storage, "storage")
        return job.storage

    def _call(self, address: str, msg_type: str, fields: dict, timeout: float = CALL_TIMEOUT_S) -> Message:
        address = self.addresses.current(address)
        try:
            client = self.clients.get(address) or self.clients.setdefault(address, RpcClient(address, self.ctx))
            # Everything a scheduler sends is idempotent: one lost message is re-sent.
            return client.request(msg_type, fields, timeout=timeout, retries=1)
        except RemoteError as e:
            raise ProtocolError(e.code, e.message) from None
        except TimeoutError:
            raise ProtocolError("unavailable", f"{self.addresses.name(address)} did not answer {msg_type}") from None

    def _log_job(self, job: Job) -> None:
        self._call(self._job_storage(job), "LogJob", {"epoch": self.election.epoch, "job": job.record()})

    # -- handlers ----------------------------------------------------------------------------------

    def on_submit(self, msg: Message):
        epoch = self._leader()
        job_id = job_id_for(msg["job_key"])
        if job_id in self.jobs:
            job = self.jobs[job_id]
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
        storage = self._storage()
        # The input is checked and made durable on storage, then the job is logged there,
        # before it is accepted: an accepted job survives any node's death. Only a large
        # input (an upload, a file) is worth waiting long for.
        large = msg["upload_id"] or msg["input_path"]
        ready = self._call(storage, "IngestInput", {"job_id": job_id, "items": msg["items"], "upload_id": msg["upload_id"],
                                                     "program": msg["program"],
                                                     "input_path": msg["input_path"] or "", "epoch": epoch},
                           INGEST_TIMEOUT_S if large else CALL_TIMEOUT_S)
        job = Job(job_id, msg["job_key"], msg["program"], dict(msg["params"]), ready["total"], storage)
        self._log_job(job)
        self.jobs[job_id] = job
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
        job = Job(job_id, msg["job_key"], EMBED, dict(p), ready["total"], storage)
        job.detail = {k: ready[k] for k in ("partitions", "skipped", "errors", "empty", "done")}
        self._log_job(job)
        self.jobs[job_id] = job
        log.info("[job] %s (%s): embed %d texts in %d partitions (%d already in the output)", job_id, msg["job_key"],
                 job.total, ready["partitions"], ready["done"])
        return encode("JobAccepted", {"job_id": job_id, "job_key": msg["job_key"], "total": job.total,
                                      "detail": job.detail}, reply_to=msg.id)

    def on_progress(self, msg: Message):
        epoch = self._leader()
        self.held[msg["node_id"]] = int(msg["stats"].get("held", 0))
        job = self.jobs.get(msg["job_id"])
        if job is not None:
            new = 0
            for sid in msg["finished"]:
                if job.placed.pop(sid, None) is not None:
                    new += job.weight(sid)
                elif sid in job.pending_ids:  # finished elsewhere while waiting to be placed again
                    job.pending_ids.discard(sid)
                    job.pending = deque(a for a in job.pending if a["seq_id"] != sid)
                    new += job.weight(sid)
            job.done += new
            if new:  # a re-sent report adds nothing
                job.tokens += msg["tokens"]
            for sid, node in msg["moved"]:
                if job.placed.get(sid) == msg["node_id"]:  # not finished meanwhile
                    job.placed[sid] = node
            if msg["moved"]:
                self.moving.pop(msg["node_id"], None)
        return encode("ProgressAck", {"epoch": epoch}, reply_to=msg.id)

    def on_status(self, msg: Message):
        self._leader()
        job = self.jobs.get(msg["job_id"])
        if job is None:
            raise ProtocolError("unknown_job", f"no job {msg['job_id']}")
        return encode("JobStatus", job.status(), reply_to=msg.id)

    def on_cancel(self, msg: Message):
        self._leader()
        job = self.jobs.get(msg["job_id"])
        if job is None:
            raise ProtocolError("unknown_job", f"no job {msg['job_id']}")
        if job.state == "running":
            job.state = "cancelled"
            self._log_job(job)
        job.pending.clear()
        job.pending_ids.clear()
        return encode("JobStatus", job.status(), reply_to=msg.id)

    def on_drain(self, msg: Message):
        """Stop placing work on a worker, move what it holds to the others (a little
        every tick, as they have room); the worker leaves when it holds nothing."""
        epoch = self._leader()
        wid = msg["node_id"]
        worker = self.view.snapshot("worker").get(wid)
        if worker is None:
            raise ProtocolError(ProtocolError.INVALID_FIELD, f"no worker {wid!r} in the cluster")
        self._call(worker.info["address"], "DrainWorker", {"epoch": epoch})
        self.draining.add(wid)
        held = sum(1 for job in self.jobs.values() for w in job.placed.values() if w == wid)
        log.info("[drain] %s: draining, %d sequences to move", wid, held)
        return encode("OpsAck", {"detail": {"node_id": wid, "held": held}}, reply_to=msg.id)

    def on_migrate_request(self, msg: Message):
        """Moves a job's sequences (all, or the listed ones) to one worker."""
        epoch = self._leader()
        job = self.jobs.get(msg["job_id"])
        if job is None:
            raise ProtocolError("unknown_job", f"no job {msg['job_id']}")
        workers = self.view.snapshot("worker")
        target = workers.get(msg["to_node"])
        if target is None:
            raise ProtocolError(ProtocolError.INVALID_FIELD, f"no worker {msg['to_node']!r} in the cluster")
        wanted = set(msg["seq_ids"]) if msg["seq_ids"] else None
        by_source: dict[str, list] = {}
        for sid, wid in job.placed.items():
            if wid != msg["to_node"] and (wanted is None or sid in wanted) and wid in workers:
                by_source.setdefault(wid, []).append(sid)
        for wid, sids in by_source.items():
            self._call(workers[wid].info["address"], "MigrateSequences",
                       {"epoch": epoch, "job_id": job.job_id, "to_node": msg["to_node"],
                        "to_address": target.info["address"], "seq_ids": sids})
        return encode("OpsAck", {"detail": {"moving": sum(map(len, by_source.values())),
                                            "from": {w: len(s) for w, s in by_source.items()}}}, reply_to=msg.id)

    def _held_by_worker(self) -> dict[str, dict[str, int]]:
        """worker -> job -> sequences placed there (the scheduler's own table)."""
        out: dict[str, dict[str, int]] = {}
        for job in self.jobs.values():
            if job.embedding:  # SuperBatches are few per worker and short: never moved
                continue
            for wid in job.placed.values():
                per = out.setdefault(wid, {})
                per[job.job_id] = per.get(job.job_id, 0) + 1
        return out

    def _rebalance(self, workers: dict) -> None:
        """Drains, then work stealing once nothing waits to be placed."""
        now = time.monotonic()
        self.moving = {w: t for w, t in self.moving.items() if t > now}
        self.draining &= set(workers)  # a drained worker has left
        by_worker = self._held_by_worker()
        held = {w: sum(by_worker.get(w, {}).values()) for w in workers}
        cap = {w: int(workers[w].info.get("max_seqs", DEFAULT_MAX_HELD)) * 2 for w in workers}
        moves: list[Move] = []
        for wid in sorted(self.draining):
            if wid not in self.moving and held[wid]:
                moves += plan_drain(wid, held, cap, held[wid], exclude=self.draining | set(self.moving))
        if self.steal and not moves:
            pending = sum(len(j.pending) + (j.cursor < j.total) for j in self.jobs.values()
                          if j.state == "running" and not j.embedding)
            active = {w: n for w, n in held.items() if w not in self.draining}
            moves = plan_steals(active, cap, pending, busy=set(self.moving))
        for m in moves:
            self._send_move(m, workers, by_worker.get(m.source, {}))
            self.moving[m.source] = self.moving[m.target] = now + 10.0

    def _send_move(self, move: Move, workers: dict, jobs: dict[str, int]) -> None:
        left = move.count
        for job_id, n in sorted(jobs.items(), key=lambda kv: -kv[1]):
            if left <= 0:
                break
            take = min(n, left)
            try:
                self._call(workers[move.source].info["address"], "MigrateSequences",
                           {"epoch": self.election.epoch, "job_id": job_id, "to_node": move.target,
                            "to_address": workers[move.target].info["address"], "count": take})
                log.info("[move] %d sequences of %s: %s -> %s", take, job_id, move.source, move.target)
            except ProtocolError as e:
                log.warning("[move] %s -> %s failed: %s", move.source, move.target, e)
            left -= take

    # -- takeover ----------------------------------------------------------------------------------

    def _take_over(self) -> None:
        """Rebuilds the job table for this epoch: the job log from storage, what each
        worker holds. Until it has, requests get 'unavailable' and clients retry."""
        epoch = self.election.epoch
        self.jobs, self.held = {}, {}
        storage = self._storage()
        listing = self._call(storage, "ListJobs", {"epoch": epoch}, 30.0)
        for rec in listing["jobs"]:
            job = Job(rec["job_id"], rec["job_key"], rec["program"], rec["params"], rec["total"], storage, rec["state"])
            job.done, job.detail = rec["done"], rec.get("detail") or {}
            self.jobs[job.job_id] = job
        for wid, w in self.view.snapshot("worker").items():
            try:
                holding = self._call(w.info["address"], "HoldingQuery", {"epoch": epoch, "report_to": self.advertise})
            except ProtocolError as e:
                log.warning("[takeover] worker %s did not say what it holds (%s)", wid, e)
                continue
            self.incarnations[wid] = w.info.get("incarnation")
            for job_id, sids in holding["jobs"].items():
                if job_id in self.jobs:
                    self.jobs[job_id].placed.update((sid, wid) for sid in sids)
            self.held[wid] = sum(len(s) for s in holding["jobs"].values())
        self.ready_epoch = epoch
        running = [j for j in self.jobs.values() if j.state == "running"]
        log.info("[takeover] epoch %d: %d jobs (%d running), %d sequences held by workers", epoch, len(self.jobs),
                 len(running), sum(len(j.placed) for j in running))

    # -- placement ---------------------------------------------------------------------------------

    def tick(self) -> None:
        if not self.election.is_leader():
            if self.ready_epoch:
                self.ready_epoch, self.jobs = 0, {}  # a standby now: the next leader owns the table
            return
        if self.ready_epoch != self.election.epoch:
            try:
                self._take_over()
            except ProtocolError as e:
                log.warning("[takeover] not yet: %s", e)
                time.sleep(0.5)
            return
        workers = self.view.snapshot("worker")
        reborn = set()  # workers that lost their lease and registered again: they hold nothing
        for wid, w in workers.items():
            inc = w.info.get("incarnation")
            if self.incarnations.setdefault(wid, inc) != inc:
                reborn.add(wid)
                self.incarnations[wid], self.held[wid] = inc, 0
                log.warning("[worker] %s came back as a new incarnation; its work is placed again", wid)
        for job in self.jobs.values():
            lost = [sid for sid, w in job.placed.items() if w not in workers or w in reborn]
            for sid in lost:
                del job.placed[sid]
            if lost:  # the worker left: its items are found again by a rescan
                log.warning("[job] %s: %d sequences of departed workers placed again", job.job_id, len(lost))
                job.rescan()
        capacity = sum(int(w.info.get("max_seqs", DEFAULT_MAX_HELD)) * 2 for w in workers.values())
        placeable = {wid: w for wid, w in workers.items() if wid not in self.draining}
        for job in self.jobs.values():
            if job.state != "running":
                continue
            try:
                if job.embedding:
                    self._plan_superbatches(job)
                    if job.pending and placeable:
                        self._place_superbatches(job, placeable)
                elif placeable:
                    self._read_inputs(job, want=capacity)
                    if job.pending:
                        self._place(job, placeable)
                self._finish_if_done(job)
            except ProtocolError as e:
                log.warning("[job] %s: %s; retrying", job.job_id, e)
        if workers:
            self._rebalance(workers)

    def _read_inputs(self, job: Job, want: int) -> None:
        """Reads pages of the job's unfinished items until enough are pending to fill
        the workers, skipping those already pending or placed."""
        while len(job.pending) < want and job.cursor < job.total:
            page = self._call(self._job_storage(job), "ReadInput", {"job_id": job.job_id, "offset": job.cursor,
                                                         "limit": INPUT_PAGE, "pending_only": True})
            checkpoints = page["checkpoints"] or [None] * len(page["items"])
            for item, state in zip(page["items"], checkpoints):
                if item["id"] not in job.placed and item["id"] not in job.pending_ids:
                    job.pending.append(job.assignment(item, state))
                    job.pending_ids.add(item["id"])
            if page["next_offset"] <= job.cursor:
                raise ProtocolError("internal", f"storage read no further than input position {job.cursor}")
            job.cursor = page["next_offset"]

    def _pages(self, job: Job, msg_type: str, key: str) -> list:
        out, offset = [], 0
        while True:
            page = self._call(self._job_storage(job), msg_type, {"job_id": job.job_id, "offset": offset})
            out += page[key]
            if page["next_offset"] >= page["total"] or page["next_offset"] <= offset:
                return out
            offset = page["next_offset"]

    def _plan_superbatches(self, job: Job) -> None:
        """Packs the job's SuperBatches (once: the partition list never changes) and
        makes pending every one that the output does not hold and no worker has. Runs
        again after a rescan (a lost worker, a takeover, a shortfall at the end)."""
        if job.cursor >= job.total:
            return
        if job.superbatches is None:
            partitions = self._pages(job, "ReadPartitions", "partitions")
            try:
                packed = pack([(name, size) for name, size in partitions], job.params["b_min"], job.params["n_max"])
            except ValueError as e:
                raise ProtocolError(ProtocolError.INVALID_FIELD, str(e)) from None
            job.superbatches = {sb.id: {"seq_id": sb.id, "slices": [[s.partition, s.start, s.end] for s in sb.slices],
                                        "size": sb.size} for sb in packed}
        done = set(self._pages(job, "ReadManifest", "ids"))
        job.pending = deque(sb for sid, sb in job.superbatches.items() if sid not in done and sid not in job.placed)
        job.pending_ids = {sb["seq_id"] for sb in job.pending}
        job.cursor = job.total

    def _place_superbatches(self, job: Job, workers: dict) -> None:
        """Gives each worker that hosts the job's encoder SuperBatches up to the bound
        in flight: the corpus streams through, never buffered whole anywhere."""
        fingerprint = job.params["encoder"]["fingerprint"]
        hosts = {wid: w for wid, w in workers.items() if w.info.get("encoder") == fingerprint}
        if not hosts:
            if not job.detail.get("waiting_for_encoder"):
                log.warning("[job] %s: no worker hosts encoder %s (%s); waiting", job.job_id, fingerprint,
                            job.params["encoder"].get("name"))
                job.detail["waiting_for_encoder"] = True
            return
        job.detail.pop("waiting_for_encoder", None)
        in_flight = {wid: 0 for wid in hosts}
        for other in self.jobs.values():
            if other.embedding:
                for wid in other.placed.values():
                    if wid in in_flight:
                        in_flight[wid] += 1
        for wid in sorted(hosts, key=lambda w: in_flight[w]):
            room = self.superbatches_in_flight - in_flight[wid]
            if room <= 0 or not job.pending:
                continue
            batch = [job.pending.popleft() for _ in range(min(room, len(job.pending)))]
            try:
                self._call(hosts[wid].info["address"], "AssignSuperBatches", {
                    "epoch": self.election.epoch, "job_id": job.job_id, "storage": self._job_storage(job), "report_to": self.advertise,
                    "superbatches": [{"id": sb["seq_id"], "slices": sb["slices"]} for sb in batch],
                    "encoder": fingerprint, "vector_dtype": job.params.get("vector_dtype", "float32")})
            except ProtocolError as e:
                log.warning("[place] %d SuperBatches to %s failed (%s); they stay pending", len(batch), wid, e)
                job.pending.extendleft(reversed(batch))
                continue
            for sb in batch:
                job.placed[sb["seq_id"]] = wid
                job.pending_ids.discard(sb["seq_id"])

    def _finish_if_done(self, job: Job) -> None:
        """Done when nothing is left to read, pending or placed, and storage holds a
        result for every item (else some item fell between: rescan for it)."""
        if job.cursor < job.total or job.pending or job.placed:
            return
        counts = self._call(self._job_storage(job), "ResultCountQuery", {"job_id": job.job_id})
        if counts["records"] < job.total:
            job.rescan()
            return
        job.done, job.state, job.finished_at = counts["records"], "done", time.monotonic()
        self._log_job(job)
        log.info("[job] %s done in %.1fs", job.job_id, job.finished_at - job.started)

    def _place(self, job: Job, workers: dict) -> None:
        # A worker may hold twice its batch: the second half waits in its queue, so its
        # engine never idles between a finish and the next assignment.
        speeds = {wid: self._speed(w.info) for wid, w in workers.items()}
        known = [v for v in speeds.values() if v is not None]
        typical = sum(known) / len(known) if known else 1.0  # uncalibrated workers count as average
        loads = [WorkerLoad(w.node_id, int(w.info.get("kv_tokens", 1 << 30)), self.held.get(w.node_id, 0),
                            int(w.info.get("max_seqs", DEFAULT_MAX_HELD)) * 2, speeds[wid] or typical,
                            w.info.get("max_seq_tokens"))
                 for wid, w in workers.items()]
        by_id = {a["seq_id"]: a for a in job.pending}
        placed, left = place([PendingSeq(sid, self._kv_need(a["item"], job.params)) for sid, a in by_id.items()], loads)
        job.pending = deque(by_id[p.seq_id] for p in left)
        for wid, sids in placed.items():
            # Items and checkpoints travel in the header: one message per ~512 KiB.
            for seqs in by_size([by_id[s] for s in sids], lambda a: len(orjson.dumps(a))):
                part = [a["seq_id"] for a in seqs]
                try:
                    # If only the reply is lost they stay pending and may run twice: the
                    # worker drops an assignment it holds already, storage a second result.
                    self._call(workers[wid].info["address"], "AssignSequences",
                               {"epoch": self.election.epoch, "job_id": job.job_id, "sequences": seqs,
                                "program": job.program, "args": job.params,
                                "report_to": self.advertise, "storage": self._job_storage(job)})
                    job.placed.update((s, wid) for s in part)
                    job.pending_ids.difference_update(part)
                    self.held[wid] = self.held.get(wid, 0) + len(part)
                except ProtocolError as e:
                    log.warning("[place] %d sequences to %s failed (%s); they stay pending", len(part), wid, e)
                    job.pending.extend(seqs)

    @staticmethod
    def _speed(info: dict) -> float | None:
        """Decode sequence-steps per second from the worker's published calibration (1/β_d)."""
        cal = info.get("calibration") or {}
        beta_d = cal.get("beta_d") or 0
        return 1.0 / beta_d if beta_d > 0 else None

    @staticmethod
    def _kv_need(item: dict, params: dict) -> int:
        """KV tokens an item will need, as far as its fields tell (a program with several
        operations may need more; the worker's own admission has the last word)."""
        ids, text = item.get("prompt_token_ids"), item.get("prompt")
        prompt = len(ids) if isinstance(ids, list) else len(text) // 3 + 1 if isinstance(text, str) else 1
        out = item.get("max_tokens") or params.get("max_tokens")
        return prompt + (out if isinstance(out, int) and out > 0 else 64)  # a bad value fails on the worker

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
    node = SchedulerNode(node_id, args.etcd, args.cluster, steal=not args.no_steal,
                         superbatches_in_flight=args.superbatches_in_flight, bind=args.bind,
                         advertise=args.advertise)
    return run_node(node, args.metrics_port)

if __name__ == "__main__":
    raise SystemExit(main())
