"""One simulated worker: the real worker's protocol and bookkeeping, no engine.

It answers what a scheduler and its peers send a worker — AssignSequences,
HoldingQuery, MigrateSequences, DrainWorker, ImportSequence — with the real worker's
rules (the epoch fence, a re-sent assignment or import taken once, a draining worker
refusing work), runs up to `max_seqs` sequences at once, each for the seconds its item
names (`sim_s`, on the host's clock), and delivers what finishes as a worker does:
WriteResults to the job's storage until acknowledged, then a ProgressReport to the
leader. Moves hand queued sequences over (there is no KV to ship).

Its host (`sim_worker_host.py`) owns the sockets' loop, the clock and the outbox; the
endpoint only keeps its own state. It records the wait a worker sees between a
progress report that freed slots and the next assignment: the scheduler's decision
latency, end to end.
"""

from __future__ import annotations

import time
from collections import deque

from shoal.nodes.latency_histogram import LatencyHistogram
from shoal.nodes.node import Node
from shoal.transport.outbox import Outbox, Request
from shoal.protocol.codec import Message, encode
from shoal.protocol.errors import ProtocolError


class SimWorkerEndpoint(Node):
    role = "worker"

    def __init__(self, node_id: str, ctx, shared_outbox: Outbox, max_seqs: int = 256, report_every_s: float = 0.25,
                 bind: str = "tcp://127.0.0.1:0"):
        self._ctx = ctx
        self.shared_outbox = shared_outbox
        self.max_seqs = max_seqs
        self.report_every_s = report_every_s
        self.epoch = 0
        self.draining = False
        self.jobs: dict[str, dict] = {}  # job_id -> {"storage", "report_to"}
        self.queue: deque = deque()  # (job_id, seq) waiting for a slot
        self.running = 0
        self.held: dict[str, set] = {}  # job_id -> seq ids queued, running, moving or not yet stored
        self.done: dict[str, list] = {}  # job_id -> [(seq_id, tokens)] finished, not yet written
        self.writing = False  # a write-then-report chain is in flight
        self.last_write = 0.0
        self.waiting_since: float | None = None  # a report freed slots; no assignment yet
        self.decision = LatencyHistogram()  # report -> next assignment
        self.report_ack = LatencyHistogram()  # report -> the scheduler's ack
        super().__init__(node_id, bind=bind)

    def make_context(self):
        return self._ctx  # one context (one IO thread) for every endpoint of the host

    def handler_table(self) -> dict:
        return {"AssignSequences": self.on_assign, "HoldingQuery": self.on_holding,
                "MigrateSequences": self.on_migrate, "ImportSequence": self.on_import_sequence,
                "DrainWorker": self.on_drain, "DropJob": self.on_drop_job}

    def held_count(self) -> int:
        return sum(len(ids) for ids in self.held.values())

    # -- what the scheduler and peers send -----------------------------------------------

    def _fence(self, epoch: int) -> None:
        if epoch < self.epoch:
            self.counters["errors.stale_epoch"] += 1
            raise ProtocolError(ProtocolError.STALE_EPOCH, f"epoch {epoch} is older than the current leader's epoch {self.epoch}")
        self.epoch = epoch

    def _refuse_if_draining(self) -> None:
        if self.draining:
            raise ProtocolError(ProtocolError.DRAINING, f"worker {self.node_id} is draining and takes no new work")

    def _queue(self, job_id: str, seqs: list) -> int:
        held = self.held.setdefault(job_id, set())
        fresh = [s for s in seqs if s["seq_id"] not in held]
        held.update(s["seq_id"] for s in fresh)
        self.queue.extend((job_id, s) for s in fresh)
        return len(fresh)

    def on_assign(self, msg: Message):
        self._fence(msg["epoch"])
        self._refuse_if_draining()
        seqs = msg["sequences"]
        for s in seqs:
            if not isinstance(s, dict) or "seq_id" not in s or not isinstance(s.get("item"), dict):
                raise ProtocolError(ProtocolError.INVALID_FIELD, f"assigned sequence without seq_id or item: {str(s)[:60]}")
        if self.waiting_since is not None:
            self.decision.add(time.monotonic() - self.waiting_since)
            self.waiting_since = None
        job = self.jobs.setdefault(msg["job_id"], {})
        job["storage"], job["report_to"] = msg["storage"] or job.get("storage", ""), msg["report_to"] or job.get("report_to", "")
        taken = self._queue(msg["job_id"], seqs)
        self.counters["sequences.assigned"] += taken
        self.counters["sequences.duplicate"] += len(seqs) - taken
        return encode("AssignAck", {"job_id": msg["job_id"], "accepted": taken, "refused": []}, reply_to=msg.id)

    def on_holding(self, msg: Message):
        self._fence(msg["epoch"])
        for job in self.jobs.values():
            job["report_to"] = msg["report_to"]
        jobs = {job_id: sorted(ids, key=str) for job_id, ids in self.held.items() if ids}
        return encode("Holding", {"node_id": self.node_id, "jobs": jobs}, reply_to=msg.id)

    def on_drop_job(self, msg: Message):
        """A cancelled job: its queued sequences never start (running ones finish)."""
        self._fence(msg["epoch"])
        job_id = msg["job_id"]
        dropped = [s["seq_id"] for j, s in self.queue if j == job_id]
        self.queue = deque((j, s) for j, s in self.queue if j != job_id)
        self.held.get(job_id, set()).difference_update(dropped)
        return encode("OpsAck", {"detail": {"node_id": self.node_id, "dropped": len(dropped)}}, reply_to=msg.id)

    def on_drain(self, msg: Message):
        self._fence(msg["epoch"])
        self.draining = True
        return encode("OpsAck", {"detail": {"held": self.held_count()}}, reply_to=msg.id)

    def on_import_sequence(self, msg: Message):
        self._refuse_if_draining()
        seq = msg["sequence"]
        if not isinstance(seq, dict) or "seq_id" not in seq or not isinstance(seq.get("item"), dict):
            raise ProtocolError(ProtocolError.INVALID_FIELD, "ImportSequence needs a sequence with seq_id and item")
        job = self.jobs.setdefault(msg["job_id"], {})
        # A peer may carry a deposed leader's addresses: the leader's own win.
        job["storage"] = job.get("storage") or msg["storage"]
        job["report_to"] = job.get("report_to") or msg["report_to"]
        self.counters["sequences.imported"] += self._queue(msg["job_id"], [seq])
        return encode("ImportAck", {"job_id": msg["job_id"], "seq_id": seq["seq_id"]}, reply_to=msg.id)

    def on_migrate(self, msg: Message):
        """Hands queued sequences over (listed ones, or `count` from the back of the
        queue, as the real worker moves its queued ones first); each is let go and
        reported moved once the target holds it. One still running stays here."""
        self._fence(msg["epoch"])
        if msg["to_node"] == self.node_id:
            raise ProtocolError(ProtocolError.INVALID_FIELD, f"cannot migrate sequences of {self.node_id} to itself")
        job_id, listed = msg["job_id"], set(msg["seq_ids"] or ())
        mine = [(j, s) for j, s in self.queue if j == job_id and (not listed or s["seq_id"] in listed)]
        count = len(mine) if listed or msg["count"] < 0 else min(msg["count"], len(mine))
        going = mine[len(mine) - count:]
        ids = {s["seq_id"] for _, s in going}
        self.queue = deque(e for e in self.queue if not (e[0] == job_id and e[1]["seq_id"] in ids))
        for _, s in going:
            self._send_over(job_id, s, msg["to_node"], msg["to_address"])
        self.counters["migrations.started"] += len(going)
        return encode("MigrateAck", {"job_id": job_id, "accepted": len(going)}, reply_to=msg.id)

    def _send_over(self, job_id: str, seq: dict, to_node: str, to_address: str) -> None:
        job = self.jobs.get(job_id, {})

        def moved(_reply) -> None:
            self.held.get(job_id, set()).discard(seq["seq_id"])
            self.counters["migrations.done"] += 1
            self.shared_outbox.send(Request(lambda: self.jobs.get(job_id, {}).get("report_to", ""), "ProgressReport",
                                     {"node_id": self.node_id, "job_id": job_id, "moved": [[seq["seq_id"], to_node]],
                                      "stats": {"held": self.held_count()}}, follow=True))

        def refused(_reply) -> bool:  # the target cannot take it: it runs here after all
            self.counters["migrations.failed"] += 1
            self.queue.appendleft((job_id, seq))
            return True

        self.shared_outbox.send(Request(lambda: to_address, "ImportSequence",
                                 {"transfer_id": f"{self.node_id}-{seq['seq_id']}", "job_id": job_id,
                                  "program": "sim", "sequence": seq, "storage": job.get("storage", ""),
                                  "report_to": job.get("report_to", "")}, moved, refused))

    # -- running and delivering (called by the host's loop) ----------------------------------

    def start_queued(self) -> list[tuple[float, str, object, int]]:
        """Fills free slots: (seconds to run, job_id, seq_id, tokens) for each started."""
        started = []
        while self.running < self.max_seqs and self.queue:
            job_id, s = self.queue.popleft()
            item = s["item"]
            self.running += 1
            started.append((float(item.get("sim_s", 1.0)), job_id, s["seq_id"], int(item.get("sim_tokens", 0))))
        return started

    def finished(self, job_id: str, seq_id, tokens: int) -> None:
        self.running -= 1
        self.done.setdefault(job_id, []).append((seq_id, tokens))

    def flush(self, now: float) -> None:
        """Starts a write-then-report chain for one job's finished sequences, if none is
        in flight and the last began at least report_every_s ago (a real worker's
        writer batches what finished while its previous delivery was under way)."""
        if self.writing or now - self.last_write < self.report_every_s:
            return
        job_id = next((j for j, d in self.done.items() if d), None)
        if job_id is None:
            return
        entries, self.done[job_id] = self.done[job_id], []
        job = self.jobs.get(job_id, {})
        records = [{"id": sid, "text": "", "token_ids": [], "finish_reason": "length"} for sid, _ in entries]
        self.writing, self.last_write = True, now

        def stored(_reply) -> None:
            ids = [sid for sid, _ in entries]
            self.held.get(job_id, set()).difference_update(ids)
            sent = time.monotonic()
            if self.waiting_since is None:
                self.waiting_since = sent
            self.shared_outbox.send(Request(lambda: self.jobs.get(job_id, {}).get("report_to", ""), "ProgressReport",
                                     {"node_id": self.node_id, "job_id": job_id, "finished": ids,
                                      "tokens": sum(t for _, t in entries), "stats": {"held": self.held_count()}},
                                     lambda _r: reported(sent), follow=True))

        def reported(sent: float) -> None:
            self.report_ack.add(time.monotonic() - sent)
            self.counters["results.reported"] += len(entries)
            self.writing = False

        self.shared_outbox.send(Request(lambda: job.get("storage", ""), "WriteResults", {"job_id": job_id, "records": records},
                                 stored))
