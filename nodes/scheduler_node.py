"""The scheduler node: one active leader, elected through etcd; standbys wait.

It owns the job table and where every sequence runs: it turns a job's items into
sequences, places them on workers within their capacity (`scheduler/placement.py`), and learns
from the workers' batched progress reports which sequences are stored. A worker that
leaves the member view has its unfinished sequences placed again (storage keeps the
first result of each, so a late duplicate is harmless). Every command carries the
leader's epoch. A job's items live on storage (checked there at submit) and are read
in pages as workers have room. The job table itself lives in memory for now: a
restarted scheduler does not know earlier jobs yet (the durable job log is the next step).
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
import time
from collections import deque
from dataclasses import dataclass, field

from shoal.nodes.leader import Election
from shoal.nodes.membership import MemberView
from shoal.nodes.node import Node, node_arg_parser, run_node, start_logging
from shoal.protocol.codec import Message, encode
from shoal.protocol.errors import ProtocolError
from shoal.rpc import RemoteError, RpcClient
from shoal.scheduler.placement import PendingSeq, WorkerLoad, place

log = logging.getLogger(__name__)

PROGRAMS = ("generate",)
DEFAULT_MAX_HELD = 256
INPUT_PAGE = 512  # items per ReadInput
INGEST_TIMEOUT_S = 300.0  # checking a large input file on storage takes a while


@dataclass
class Job:
    """A job as the scheduler sees it. Its items stay on storage: the scheduler reads
    them in pages as workers have room, so it holds only what is pending or placed."""

    job_id: str
    job_key: str
    storage: str  # the storage node's address: inputs and results
    params: dict  # the job's sampling parameters; an item may set its own max_tokens
    total: int
    cursor: int = 0  # next input offset to read from storage
    pending: deque = field(default_factory=deque)  # assignments read but on no worker
    placed: dict = field(default_factory=dict)  # seq_id -> (worker id, assignment)
    done: set = field(default_factory=set)
    failed: set = field(default_factory=set)
    tokens: int = 0
    state: str = "running"
    started: float = field(default_factory=time.monotonic)
    finished_at: float | None = None

    def status(self) -> dict:
        elapsed = (self.finished_at or time.monotonic()) - self.started
        return {"job_id": self.job_id, "state": self.state, "total": self.total, "done": len(self.done),
                "failed": len(self.failed), "tokens_per_s": self.tokens / max(elapsed, 1e-9)}

    def assignment(self, item: dict) -> dict:
        params = {**self.params, **({"max_tokens": item["max_tokens"]} if item.get("max_tokens") else {})}
        return {"seq_id": item["id"], "prompt": item.get("prompt"), "prompt_token_ids": item.get("prompt_token_ids"),
                "params": params}


def job_id_for(job_key: str) -> str:
    return "j-" + hashlib.blake2b(job_key.encode(), digest_size=8).hexdigest()


class SchedulerNode(Node):
    role = "scheduler"

    def __init__(self, node_id: str, etcd: str, cluster: str = "default", **kw):
        super().__init__(node_id, etcd=etcd, cluster=cluster, **kw)
        self.election = Election(etcd, cluster, node_id)
        self.view = MemberView(etcd, cluster).start()
        self.jobs: dict[str, Job] = {}
        self.held: dict[str, int] = {}  # worker -> sequences it holds (last report)
        self.clients: dict[str, RpcClient] = {}
        threading.Thread(target=self.election.wait_for_leadership, name="campaign", daemon=True).start()

    def handler_table(self) -> dict:
        return {"SubmitJob": self.on_submit, "ProgressReport": self.on_progress,
                "JobStatusQuery": self.on_status, "CancelJob": self.on_cancel}

    def _leader(self) -> int:
        if not self.election.is_leader():
            raise ProtocolError("not_leader", f"scheduler {self.node_id} is a standby")
        return self.election.epoch

    def stats(self) -> dict:
        jobs = {j.job_id: {"state": j.state, "total": j.total, "done": len(j.done), "pending": len(j.pending),
                           "placed": len(j.placed)}
                for j in self.jobs.values()}
        return {**super().stats(), "leader": self.election.is_leader(), "epoch": self.election.epoch, "jobs": jobs,
                "held": dict(self.held)}

    # -- handlers ------------------------------------------------------------------------------

    def on_submit(self, msg: Message):
        self._leader()
        job_id = job_id_for(msg["job_key"])
        if job_id in self.jobs:
            job = self.jobs[job_id]
            if msg["upload_id"]:  # a retried submit re-sent its upload: storage drops that copy
                self._call(job.storage, "IngestInput", {"job_id": job_id, "upload_id": msg["upload_id"]}, INGEST_TIMEOUT_S)
            return encode("JobAccepted", {"job_id": job_id, "job_key": msg["job_key"], "total": job.total,
                                          "duplicate": True}, reply_to=msg.id)
        if msg["program"] not in PROGRAMS:
            raise ProtocolError(ProtocolError.INVALID_FIELD, f"unknown program {msg['program']!r}; known: {', '.join(PROGRAMS)}")
        storage = self._storage()
        # The input is checked and made durable on storage before the job exists.
        ready = self._call(storage, "IngestInput", {"job_id": job_id, "items": msg["items"], "upload_id": msg["upload_id"],
                                                     "input_path": msg["input_path"] or ""}, INGEST_TIMEOUT_S)
        job = Job(job_id, msg["job_key"], storage, dict(msg["params"]), ready["total"])
        self.jobs[job_id] = job
        self._finish_if_done(job)
        log.info("[job] %s (%s): %d sequences", job_id, msg["job_key"], job.total)
        return encode("JobAccepted", {"job_id": job_id, "job_key": msg["job_key"], "total": job.total}, reply_to=msg.id)

    def _storage(self) -> str:
        members = self.view.snapshot("storage")
        if not members:
            raise ProtocolError("unavailable", "no storage node in the cluster")
        return members[min(members)].info["address"]  # the same choice the router makes

    def _call(self, address: str, msg_type: str, fields: dict, timeout: float) -> Message:
        try:
            client = self.clients.get(address) or self.clients.setdefault(address, RpcClient(address, self.ctx))
            return client.request(msg_type, fields, timeout=timeout)
        except RemoteError as e:
            raise ProtocolError(e.code, str(e).split(": ", 1)[-1]) from None
        except TimeoutError:
            self.clients.pop(address).close()  # a late reply must not answer the next request
            raise ProtocolError("unavailable", f"{address} did not answer {msg_type}") from None

    def _finish_if_done(self, job: Job) -> None:
        if len(job.done) >= job.total and job.state == "running":
            job.state = "done"
            job.finished_at = time.monotonic()
            log.info("[job] %s done in %.1fs", job.job_id, job.finished_at - job.started)

    def on_progress(self, msg: Message):
        epoch = self._leader()
        self.held[msg["node_id"]] = int(msg["stats"].get("held", 0))
        job = self.jobs.get(msg["job_id"])
        if job is not None:
            new = [sid for sid in msg["finished"] if sid not in job.done]
            for sid in new:
                job.done.add(sid)
                job.placed.pop(sid, None)
            job.failed.update(sid for sid in msg["failed"] if sid in job.done)
            if new:  # a re-sent report adds nothing
                job.tokens += msg["tokens"]
            self._finish_if_done(job)
        return encode("ProgressAck", {"epoch": epoch}, reply_to=msg.id)

    def on_status(self, msg: Message):
        job = self.jobs.get(msg["job_id"])
        if job is None:
            raise ProtocolError("unknown_job", f"no job {msg['job_id']}")
        return encode("JobStatus", job.status(), reply_to=msg.id)

    def on_cancel(self, msg: Message):
        job = self.jobs.get(msg["job_id"])
        if job is None:
            raise ProtocolError("unknown_job", f"no job {msg['job_id']}")
        job.pending.clear()
        job.cursor = job.total
        if job.state == "running":
            job.state = "cancelled"
        return encode("JobStatus", job.status(), reply_to=msg.id)

    # -- placement -------------------------------------------------------------------------------

    def tick(self) -> None:
        if not self.election.is_leader():
            return
        workers = self.view.snapshot("worker")
        for job in self.jobs.values():
            lost = [sid for sid, (w, _) in job.placed.items() if w not in workers]
            for sid in lost:  # the worker left: place its sequences again
                job.pending.append(job.placed.pop(sid)[1])
            if lost:
                log.warning("[job] %s: %d sequences of departed workers placed again", job.job_id, len(lost))
        capacity = sum(int(w.info.get("max_seqs", DEFAULT_MAX_HELD)) * 2 for w in workers.values())
        for job in self.jobs.values():
            if job.state != "running" or not workers:
                continue
            self._read_inputs(job, want=capacity)
            if job.pending:
                self._place(job, workers)

    def _read_inputs(self, job: Job, want: int) -> None:
        """Reads pages of the job's input until enough is pending to fill the workers."""
        while len(job.pending) < want and job.cursor < job.total:
            try:
                page = self._call(job.storage, "ReadInput", {"job_id": job.job_id, "offset": job.cursor,
                                                             "limit": INPUT_PAGE}, 30.0)
            except ProtocolError as e:
                log.warning("[input] %s: reading items at %d failed (%s); retrying", job.job_id, job.cursor, e)
                return
            if not page["items"]:
                log.error("[input] %s: storage has no items at %d of %d", job.job_id, job.cursor, job.total)
                return
            job.pending.extend(job.assignment(it) for it in page["items"])
            job.cursor += len(page["items"])

    def _place(self, job: Job, workers: dict) -> None:
        # A worker may hold twice its batch: the second half waits in its queue, so its
        # engine never idles between a finish and the next assignment.
        speeds = {wid: self._speed(w.info) for wid, w in workers.items()}
        known = [v for v in speeds.values() if v is not None]
        typical = sum(known) / len(known) if known else 1.0  # uncalibrated workers count as average
        loads = [WorkerLoad(w.node_id, int(w.info.get("kv_tokens", 1 << 30)), self.held.get(w.node_id, 0),
                            int(w.info.get("max_seqs", DEFAULT_MAX_HELD)) * 2, speeds[wid] or typical)
                 for wid, w in workers.items()]
        pend = [PendingSeq(a["seq_id"], self._kv_need(a)) for a in job.pending]
        by_id = {a["seq_id"]: a for a in job.pending}
        placed, left = place(pend, loads)
        job.pending = deque(by_id[p.seq_id] for p in left)
        for wid, sids in placed.items():
            seqs = [by_id[s] for s in sids]
            try:
                client = self.clients.get(wid) or self.clients.setdefault(wid, RpcClient(workers[wid].info["address"], self.ctx))
                client.request("AssignSequences", {"epoch": self.election.epoch, "job_id": job.job_id,
                                                   "sequences": seqs, "report_to": self.advertise,
                                                   "storage": job.storage}, timeout=5)
                for a in seqs:
                    job.placed[a["seq_id"]] = (wid, a)
                self.held[wid] = self.held.get(wid, 0) + len(sids)
            except Exception as e:
                log.warning("[place] %d sequences to %s failed (%s); they stay pending", len(sids), wid, e)
                self.clients.pop(wid, None)
                job.pending.extend(seqs)

    @staticmethod
    def _speed(info: dict) -> float | None:
        """Decode sequence-steps per second from the worker's published calibration (1/β_d)."""
        cal = info.get("calibration") or {}
        beta_d = cal.get("beta_d") or 0
        return 1.0 / beta_d if beta_d > 0 else None

    @staticmethod
    def _kv_need(item: dict) -> int:
        prompt = len(item["prompt_token_ids"]) if item.get("prompt_token_ids") else len(item.get("prompt") or "") // 3 + 1
        return prompt + int(item["params"].get("max_tokens", 64))

    def close(self) -> None:
        self.election.resign()
        self.view.stop()
        super().close()


def main(argv: list[str] | None = None) -> int:
    args = node_arg_parser("scheduler", etcd_required=True).parse_args(argv)
    node_id = args.node_id or f"scheduler-{os.getpid()}"
    start_logging("scheduler", node_id)
    node = SchedulerNode(node_id, args.etcd, args.cluster, bind=args.bind, advertise=args.advertise)
    return run_node(node, args.metrics_port)

if __name__ == "__main__":
    raise SystemExit(main())
