"""The scheduler's decisions, as an object that takes events and returns commands.

Everything the scheduler decides lives here: the job table, reading inputs in pages as
workers have room, placement, SuperBatch dispatch, finding the work of a departed
worker again, drains and work stealing, and the reconciliation after a leader takeover.
No sockets, no etcd, no threads and no clock: each event comes with what it needs (a
tick with the clock's value), and each call returns commands (`scheduler/commands.py`)
for a shell to carry out — the scheduler node over ZeroMQ, or the cluster simulator in
memory. What a command's answer says comes back as the next event.

Placement marks sequences placed when it emits the command; an `AssignSequences` that
fails comes back through `assign_failed`. A duplicate execution (a lost reply, a
takeover, a worker lost mid-move) is harmless: storage keeps an item's first result.
"""

from __future__ import annotations

import logging
from collections import deque

from shoal.protocol.generation_settings import max_tokens_for
from shoal.scheduler.commands import (AssignSequences, AssignSuperBatches, CountResults, DropJob, LogJob,
                                      MigrateSequences, ReadInput, ReadSuperBatchPlan)
from shoal.scheduler.job import Job, assignment, unit_id
from shoal.scheduler.placement import PendingSeq, WorkerLoad, place
from shoal.scheduler.rebalance import Move, plan_drain, plan_steals
from shoal.scheduler.superbatch import pack
from shoal.scheduler.worker_info import WorkerInfo, filled_speeds

log = logging.getLogger(__name__)

INPUT_PAGE = 512  # items per ReadInput
MOVE_TIMEOUT_S = 10.0  # a move not reported by then no longer blocks its workers
DEFAULT_SUPERBATCHES_IN_FLIGHT = 2  # per worker: one encoding, one being read


class SchedulerCore:
    def __init__(self, steal: bool = True, superbatches_in_flight: int = DEFAULT_SUPERBATCHES_IN_FLIGHT,
                 input_page: int = INPUT_PAGE):
        self.steal = steal
        self.superbatches_in_flight = superbatches_in_flight
        self.input_page = input_page
        self.jobs: dict[str, Job] = {}
        self.workers: dict[str, WorkerInfo] = {}
        self.held: dict[str, int] = {}  # worker -> sequences it holds (its last report, plus placements since)
        self.incarnations: dict[str, object] = {}  # worker -> the lease it registered under
        self.draining: set[str] = set()  # workers being emptied: they get no new work
        self.moving: dict[str, float] = {}  # worker -> deadline of a move it is part of
        self._fastest: float | None = None  # the fastest worker's speed (sequence-steps/s)
        self._caps: dict[str, int] = {}  # worker -> sequences it may hold (`_capacity`)
        # Some sequence may be placed on a worker missing from `workers` (a move reported to
        # a target that had left, a takeover's holdings): the next update looks at them all.
        self._unseen_holders = False
        self.now = 0.0

    # -- jobs --------------------------------------------------------------------------------------

    def add_job(self, job: Job) -> None:
        self.jobs[job.job_id] = job

    def cancel(self, job_id: str) -> list[DropJob]:
        """Stops placing the job's work and changes its state to cancelled if it was
        running (the shell logs that). Every worker is told to drop the job's sequences:
        not only those the table places there, since one may be on its way to another
        worker. The table lets go of them (a late report of one counts for nothing) and
        the workers' counts lose them now, so that the next job has their room before the
        workers report. An embedding job's SuperBatches in flight are short and finish."""
        job = self.jobs.get(job_id)
        if job is None or job.state not in ("running", "cancelled"):  # a finished job stays as it is
            return []
        job.state = "cancelled"
        job.pending.clear()
        job.pending_ids.clear()
        if job.embedding:
            return []
        for wid, n in job.placed.per_worker.items():
            self.held[wid] = max(0, self.held.get(wid, 0) - n)
        job.placed.clear()
        return [DropJob(wid, job_id) for wid in sorted(self.workers)]

    def input_read(self, job_id: str, items: list, checkpoints: list | None, next_offset: int,
                   offset: int | None = None) -> list:
        """A page of a job's unfinished items, read from `offset` (the answer to
        ReadInput). A page read from anywhere but the cursor is stale (the job was
        rescanned, or rebuilt by a takeover, meanwhile) and ignored."""
        job = self.jobs.get(job_id)
        if job is None or not job.running or (offset is not None and offset != job.cursor):
            return []
        job.reading = False
        for item, state in zip(items, checkpoints or [None] * len(items)):
            job.add_pending(assignment(item, state))
        if next_offset <= job.cursor:
            raise ValueError(f"storage read no further than input position {job.cursor}")
        job.cursor = next_offset
        return self._advance(job)

    def read_failed(self, job_id: str, offset: int) -> None:
        """The ReadInput from `offset` got no page: the next tick asks again."""
        job = self.jobs.get(job_id)
        if job is not None and job.cursor == offset:
            job.reading = False

    def superbatch_state(self, job_id: str, partitions: list | None, done_ids: list) -> list:
        """An embedding job's partition list (None: planned already) and the SuperBatch ids
        its output holds (the answer to ReadSuperBatchPlan). Packing happens once — the
        partition list never changes —; what the output holds and nobody has is pending."""
        job = self.jobs.get(job_id)
        if job is None or not job.running:
            return []
        if job.superbatches is None:
            if partitions is None:
                raise ValueError(f"job {job_id} needs its partition list to plan SuperBatches")
            packed = pack([(name, size) for name, size in partitions], job.params["b_min"], job.params["n_max"])
            job.superbatches = {sb.id: {"id": sb.id, "slices": [[s.partition, s.start, s.end] for s in sb.slices],
                                        "size": sb.size} for sb in packed}
        done = set(done_ids)
        job.pending = deque(sb for sid, sb in job.superbatches.items() if sid not in done and sid not in job.placed)
        job.pending_ids = {sb["id"] for sb in job.pending}
        job.planned = True
        return self._advance(job)

    def results_counted(self, job_id: str, records: int, now: float) -> list:
        """Storage's result count for a job that has nothing left to read or place: done if
        every item has a result, else some item fell between and a rescan finds it."""
        job = self.jobs.get(job_id)
        if job is None or not job.running or job.pending or job.placed or not job.fully_read:
            return []
        if records < job.total:
            job.rescan()
            return []
        job.done, job.state, job.finished_at = records, "done", now
        log.info("[job] %s done in %.1fs", job.job_id, job.finished_at - job.started)
        return [LogJob(job.job_id, job.record())]

    # -- workers -----------------------------------------------------------------------------------

    def update_workers(self, workers: dict[str, WorkerInfo]) -> None:
        """The workers registered now. A worker that left, or came back under a new lease
        (a restart), holds nothing: its sequences are found again by a rescan."""
        reborn = set()
        for wid, w in workers.items():
            if self.incarnations.setdefault(wid, w.incarnation) != w.incarnation:
                reborn.add(wid)
                self.incarnations[wid], self.held[wid] = w.incarnation, 0
                log.warning("[worker] %s came back as a new incarnation; its work is placed again", wid)
        # Every placed sequence is looked at only when a holder may be gone: not on each tick.
        if reborn or self._unseen_holders or set(self.workers) - set(workers):
            for job in self.jobs.values():
                lost = [sid for sid, w in job.placed.items() if w not in workers or w in reborn]
                for sid in lost:
                    del job.placed[sid]
                if lost:
                    log.warning("[job] %s: %d sequences of departed workers placed again", job.job_id, len(lost))
                    job.rescan()
            self._unseen_holders = False
        for wid in set(self.held) - set(workers):
            del self.held[wid]
        if workers != self.workers:
            self.workers = dict(workers)
            self._fastest = max((w.speed for w in workers.values() if w.speed), default=None)
            self._caps = {wid: self._capacity(w) for wid, w in self.workers.items()}
        self.draining &= set(workers)  # a drained worker has left

    def progress(self, worker: str, job_id: str, finished: list, moved: list, held: int, tokens: int) -> None:
        """A worker's batched report: the sequences it finished (results stored) and moved
        since its last report, and how many it holds now. Reports may come twice."""
        self.held[worker] = held
        job = self.jobs.get(job_id)
        if job is None:
            return
        new = 0
        for sid in finished:
            if job.placed.pop(sid, None) is not None:
                new += job.weight(sid)
            elif job.drop_pending(sid):  # finished elsewhere while waiting to be placed again
                new += job.weight(sid)
        job.done += new
        if new:  # a re-sent report adds nothing
            job.tokens += tokens
        for sid, node in moved:
            if job.placed.get(sid) == worker:  # not finished meanwhile
                job.placed[sid] = node
                self._unseen_holders |= node not in self.workers
        if moved:
            self.moving.pop(worker, None)

    def assign_failed(self, command: AssignSequences | AssignSuperBatches) -> None:
        """The assignment did not reach the worker: its sequences are pending again."""
        job = self.jobs.get(command.job_id)
        if job is None:
            return
        units = command.assignments if isinstance(command, AssignSequences) else command.superbatches
        back = 0
        for a in units:
            if job.placed.get(unit_id(a)) == command.worker:
                del job.placed[unit_id(a)]
                if job.running:
                    job.add_pending(a)
                back += 1
        self.held[command.worker] = max(0, self.held.get(command.worker, 0) - back)

    def holding(self, worker: WorkerInfo, jobs: dict[str, list]) -> list[DropJob]:
        """After a takeover: what a worker says it holds, job by job. What it holds of a
        cancelled job it is told to drop (the old leader's drop may not have reached it)."""
        self.incarnations[worker.node_id] = worker.incarnation
        self._unseen_holders |= worker.node_id not in self.workers
        drops, held = [], 0
        for job_id, sids in jobs.items():
            job = self.jobs.get(job_id)
            if job is not None and job.state == "cancelled":
                drops.append(DropJob(worker.node_id, job_id))
                continue
            if job is not None:
                job.placed.update((sid, worker.node_id) for sid in sids)
            held += len(sids)
        self.held[worker.node_id] = held
        return drops

    def reset(self) -> None:
        """A new epoch: the job table is rebuilt from the job log and the workers' holdings."""
        self.jobs, self.held = {}, {}

    def drain(self, worker: str) -> int:
        """Stops placing work on a worker and moves what it holds to the others, a little
        every tick as they have room. Returns the sequences it holds."""
        self.draining.add(worker)
        return sum(job.placed.per_worker.get(worker, 0) for job in self.jobs.values())

    def migrate(self, job_id: str, to_node: str, seq_ids: list | None) -> list[MigrateSequences]:
        """Moves a job's sequences (all, or the listed ones) to one worker."""
        job = self.jobs[job_id]
        wanted = set(seq_ids) if seq_ids else None
        by_source: dict[str, list] = {}
        for sid, wid in job.placed.items():
            if wid != to_node and (wanted is None or sid in wanted) and wid in self.workers:
                by_source.setdefault(wid, []).append(sid)
        return [MigrateSequences(wid, to_node, job_id, seq_ids=tuple(sids)) for wid, sids in by_source.items()]

    # -- the periodic decisions --------------------------------------------------------------------

    def tick(self, now: float) -> list:
        """Reads, places and finishes every running job's work, then rebalances."""
        self.now = now
        out = []
        for job in list(self.jobs.values()):
            if job.running:
                out += self._advance(job)
        if self.workers:
            out += self._rebalance()
        return out

    def _capacity(self, w: WorkerInfo) -> int:
        """Sequences a worker may hold: its batch, and a queue behind it so that its
        engine never idles between a finish and the next assignment. The queue is a
        batch's worth on the fastest worker and shrinks with speed, so every queue holds
        about the same seconds of work: a slower card left with a full queue at the end
        of a job would finish it last (uncalibrated workers count as the fastest)."""
        fastest = self._fastest
        share = min(1.0, w.speed / fastest) if fastest and w.speed else 1.0
        return w.max_seqs + max(1, round(w.max_seqs * share))

    def _placeable(self) -> dict[str, WorkerInfo]:
        return {wid: w for wid, w in self.workers.items() if wid not in self.draining}

    def _advance(self, job: Job) -> list:
        """The job's next commands: read more of its input while workers could take more
        than is pending, place what is pending, and count its results once nothing is
        left anywhere."""
        placeable = self._placeable()
        if job.embedding:
            if not job.fully_read:
                return [ReadSuperBatchPlan(job.job_id, partitions=job.superbatches is None)]
            out = self._place_superbatches(job, placeable) if job.pending and placeable else []
        else:
            # Input is read ahead until every worker could be filled from what is pending;
            # one page at a time, placing from what is there meanwhile.
            want = sum(self._caps.values())
            out = []
            if placeable and len(job.pending) < want and not job.fully_read:
                if not job.reading:
                    job.reading = True
                    out.append(ReadInput(job.job_id, job.cursor, self.input_page))
                if not job.pending:
                    return out
            out += self._place(job, placeable) if job.pending and placeable else []
        if job.fully_read and not job.pending and not job.placed:
            out.append(CountResults(job.job_id))
        return out

    def _place(self, job: Job, workers: dict[str, WorkerInfo]) -> list[AssignSequences]:
        speed = filled_speeds({wid: w.speed for wid, w in workers.items()})
        loads = [WorkerLoad(wid, w.kv_tokens, self.held.get(wid, 0), self._caps[wid], speed[wid],
                            w.max_seq_tokens)
                 for wid, w in workers.items()]
        # Each placement takes a slot: past the free slots nothing is placed this tick, so
        # only that many of the pending are looked at (a tick's cost stays flat).
        room = sum(max(0, w.max_held - w.held) for w in loads)
        if room == 0:
            return []
        head = [job.pending.popleft() for _ in range(min(room, len(job.pending)))]
        by_id = {a["seq_id"]: a for a in head}
        placed, left = place([PendingSeq(sid, kv_need(a["item"], job.params)) for sid, a in by_id.items()], loads)
        job.pending.extendleft(by_id[p.seq_id] for p in reversed(left))
        out = []
        for wid, sids in placed.items():
            job.placed.update((s, wid) for s in sids)
            job.pending_ids.difference_update(sids)
            self.held[wid] = self.held.get(wid, 0) + len(sids)
            out.append(AssignSequences(wid, job.job_id, tuple(by_id[s] for s in sids)))
        return out

    def _place_superbatches(self, job: Job, workers: dict[str, WorkerInfo]) -> list[AssignSuperBatches]:
        """Gives each worker that hosts the job's encoder SuperBatches up to the bound in
        flight: the corpus streams through, never buffered whole anywhere."""
        fingerprint = job.params["encoder"]["fingerprint"]
        hosts = [wid for wid, w in workers.items() if w.encoder == fingerprint]
        if not hosts:
            if not job.detail.get("waiting_for_encoder"):
                log.warning("[job] %s: no worker hosts encoder %s (%s); waiting", job.job_id, fingerprint,
                            job.params["encoder"].get("name"))
                job.detail["waiting_for_encoder"] = True
            return []
        job.detail.pop("waiting_for_encoder", None)
        in_flight = {wid: 0 for wid in hosts}
        for other in self.jobs.values():
            if other.embedding:
                for wid, n in other.placed.per_worker.items():
                    if wid in in_flight:
                        in_flight[wid] += n
        out = []
        for wid in sorted(hosts, key=lambda w: in_flight[w]):
            room = self.superbatches_in_flight - in_flight[wid]
            if room <= 0 or not job.pending:
                continue
            batch = tuple(job.pending.popleft() for _ in range(min(room, len(job.pending))))
            for sb in batch:
                job.placed[sb["id"]] = wid
                job.pending_ids.discard(sb["id"])
            out.append(AssignSuperBatches(wid, job.job_id, batch))
        return out

    def _held_by_worker(self) -> dict[str, dict[str, int]]:
        """worker -> job -> sequences placed there (the core's own table)."""
        out: dict[str, dict[str, int]] = {}
        for job in self.jobs.values():
            if job.embedding:  # SuperBatches are few per worker and short: never moved
                continue
            for wid, n in job.placed.per_worker.items():
                out.setdefault(wid, {})[job.job_id] = n
        return out

    def _rebalance(self) -> list[MigrateSequences]:
        """Drains, then work stealing once nothing waits to be placed."""
        self.moving = {w: t for w, t in self.moving.items() if t > self.now}
        by_worker = self._held_by_worker()
        held = {w: sum(by_worker.get(w, {}).values()) for w in self.workers}
        cap = self._caps
        moves: list[Move] = []
        for wid in sorted(self.draining):
            if wid not in self.moving and held[wid]:
                moves += plan_drain(wid, held, cap, held[wid], exclude=self.draining | set(self.moving))
        if self.steal and not moves:
            pending = sum(len(j.pending) + (not j.fully_read) for j in self.jobs.values()
                          if j.running and not j.embedding)
            active = {w: n for w, n in held.items() if w not in self.draining}
            moves = plan_steals(active, cap, pending, busy=set(self.moving),
                                speed={w: self.workers[w].speed for w in active})
        out = []
        for m in moves:
            out += self._split_move(m, by_worker.get(m.source, {}))
            self.moving[m.source] = self.moving[m.target] = self.now + MOVE_TIMEOUT_S
        return out

    @staticmethod
    def _split_move(move: Move, jobs: dict[str, int]) -> list[MigrateSequences]:
        """A move of `count` sequences as per-job commands, the job with most there first."""
        out, left = [], move.count
        for job_id, n in sorted(jobs.items(), key=lambda kv: -kv[1]):
            if left <= 0:
                break
            take = min(n, left)
            out.append(MigrateSequences(move.source, move.target, job_id, count=take))
            left -= take
        return out

    # -- what it knows -----------------------------------------------------------------------------

    def stats(self) -> dict:
        jobs = {j.job_id: {"state": j.state, "total": j.total, "done": j.done, "pending": len(j.pending),
                           "placed": len(j.placed)} for j in self.jobs.values()}
        return {"jobs": jobs, "held": dict(self.held)}


def kv_need(item: dict, params: dict) -> int:
    """KV tokens an item will need, as far as its fields tell (a program with several
    operations may need more; the worker's own admission has the last word)."""
    ids, text = item.get("prompt_token_ids"), item.get("prompt")
    prompt = len(ids) if isinstance(ids, list) else len(text) // 3 + 1 if isinstance(text, str) else 1
    return prompt + max_tokens_for(item, params)  # the request contract's resolution
