"""The scheduler node: one active leader, elected through etcd; standbys wait.

It owns the job table and where every sequence runs: it splits a job into sequences,
places them on workers within their capacity (`scheduler/placement.py`), and learns
from the workers' batched progress reports which sequences are stored. A worker that
leaves the member view has its unfinished sequences placed again (storage keeps the
first result of each, so a late duplicate is harmless). Every command carries the
leader's epoch. The job table lives in memory for now: a restarted scheduler does not
know earlier jobs yet (the durable job log is the next step).
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
import time
from dataclasses import dataclass, field

from shoal.nodes.leader import Election
from shoal.nodes.membership import MemberView
from shoal.nodes.node import Node, node_arg_parser, run_node, start_logging
from shoal.protocol.codec import Message, encode
from shoal.protocol.errors import ProtocolError
from shoal.rpc import RpcClient
from shoal.scheduler.placement import PendingSeq, WorkerLoad, place

log = logging.getLogger(__name__)

PROGRAMS = ("generate",)
DEFAULT_MAX_HELD = 256


@dataclass
class Job:
    job_id: str
    job_key: str
    storage: str
    items: dict  # seq_id -> assignment dict
    pending: list = field(default_factory=list)  # seq ids not on any worker
    placed: dict = field(default_factory=dict)  # seq_id -> worker id
    done: set = field(default_factory=set)
    state: str = "running"
    started: float = field(default_factory=time.monotonic)


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
        jobs = {j.job_id: {"state": j.state, "total": len(j.items), "done": len(j.done), "pending": len(j.pending)}
                for j in self.jobs.values()}
        return {**super().stats(), "leader": self.election.is_leader(), "epoch": self.election.epoch, "jobs": jobs,
                "held": dict(self.held)}

    # -- handlers ------------------------------------------------------------------------------

    def on_submit(self, msg: Message):
        self._leader()
        job_id = job_id_for(msg["job_key"])
        if job_id in self.jobs:
            job = self.jobs[job_id]
            return encode("JobAccepted", {"job_id": job_id, "job_key": msg["job_key"], "total": len(job.items),
                                          "duplicate": True}, reply_to=msg.id)
        if msg["program"] not in PROGRAMS:
            raise ProtocolError(ProtocolError.INVALID_FIELD, f"unknown program {msg['program']!r}; known: {', '.join(PROGRAMS)}")
        storage = next(iter(self.view.snapshot("storage").values()), None)
        if storage is None:
            raise ProtocolError("unavailable", "no storage node in the cluster")
        base = msg["params"]
        items = {}
        for it in msg["items"]:
            if not isinstance(it, dict) or "id" not in it:
                raise ProtocolError(ProtocolError.INVALID_FIELD, f"item without an id: {str(it)[:60]}")
            if it["id"] in items:
                raise ProtocolError(ProtocolError.INVALID_FIELD, f"duplicate item id {it['id']!r}")
            params = {**base, **({"max_tokens": it["max_tokens"]} if it.get("max_tokens") else {})}
            items[it["id"]] = {"seq_id": it["id"], "prompt": it.get("prompt"),
                               "prompt_token_ids": it.get("prompt_token_ids"), "params": params}
        job = Job(job_id, msg["job_key"], storage.info["address"], items, pending=list(items))
        self.jobs[job_id] = job
        log.info("[job] %s (%s): %d sequences", job_id, msg["job_key"], len(items))
        return encode("JobAccepted", {"job_id": job_id, "job_key": msg["job_key"], "total": len(items)}, reply_to=msg.id)

    def on_progress(self, msg: Message):
        epoch = self._leader()
        self.held[msg["node_id"]] = int(msg["stats"].get("held", 0))
        job = self.jobs.get(msg["job_id"])
        if job is not None:
            for sid in msg["finished"]:
                if sid in job.items:
                    job.done.add(sid)
                    job.placed.pop(sid, None)
            if len(job.done) == len(job.items) and job.state == "running":
                job.state = "done"
                log.info("[job] %s done in %.1fs", job.job_id, time.monotonic() - job.started)
        return encode("ProgressAck", {"epoch": epoch}, reply_to=msg.id)

    def on_status(self, msg: Message):
        job = self.jobs.get(msg["job_id"])
        if job is None:
            raise ProtocolError("unknown_job", f"no job {msg['job_id']}")
        return encode("JobStatus", {"job_id": job.job_id, "state": job.state, "total": len(job.items),
                                    "done": len(job.done)}, reply_to=msg.id)

    def on_cancel(self, msg: Message):
        job = self.jobs.get(msg["job_id"])
        if job is None:
            raise ProtocolError("unknown_job", f"no job {msg['job_id']}")
        job.pending.clear()
        job.state = "cancelled"
        return encode("JobStatus", {"job_id": job.job_id, "state": job.state, "total": len(job.items),
                                    "done": len(job.done)}, reply_to=msg.id)

    # -- placement -------------------------------------------------------------------------------

    def tick(self) -> None:
        if not self.election.is_leader():
            return
        workers = self.view.snapshot("worker")
        for job in self.jobs.values():
            lost = [sid for sid, w in job.placed.items() if w not in workers]
            for sid in lost:  # the worker left: place its sequences again
                del job.placed[sid]
                job.pending.append(sid)
            if lost:
                log.warning("[job] %s: %d sequences of departed workers placed again", job.job_id, len(lost))
        for job in self.jobs.values():
            if job.pending and workers and job.state == "running":
                self._place(job, workers)

    def _place(self, job: Job, workers: dict) -> None:
        # A worker may hold twice its batch: the second half waits in its queue, so its
        # engine never idles between a finish and the next assignment.
        speeds = {wid: self._speed(w.info) for wid, w in workers.items()}
        known = [v for v in speeds.values() if v is not None]
        typical = sum(known) / len(known) if known else 1.0  # uncalibrated workers count as average
        loads = [WorkerLoad(w.node_id, int(w.info.get("kv_tokens", 1 << 30)), self.held.get(w.node_id, 0),
                            int(w.info.get("max_seqs", DEFAULT_MAX_HELD)) * 2, speeds[wid] or typical)
                 for wid, w in workers.items()]
        pend = [PendingSeq(sid, self._kv_need(job.items[sid])) for sid in job.pending]
        placed, left = place(pend, loads)
        job.pending = [p.seq_id for p in left]
        for wid, sids in placed.items():
            try:
                client = self.clients.get(wid) or self.clients.setdefault(wid, RpcClient(workers[wid].info["address"], self.ctx))
                client.request("AssignSequences", {"epoch": self.election.epoch, "job_id": job.job_id,
                                                   "sequences": [job.items[s] for s in sids], "report_to": self.advertise,
                                                   "storage": job.storage}, timeout=5)
                for s in sids:
                    job.placed[s] = wid
                self.held[wid] = self.held.get(wid, 0) + len(sids)
            except Exception as e:
                log.warning("[place] %d sequences to %s failed (%s); they stay pending", len(sids), wid, e)
                self.clients.pop(wid, None)
                job.pending.extend(sids)

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
