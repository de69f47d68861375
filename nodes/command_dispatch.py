"""Carrying out the scheduler core's commands for the scheduler node: each command
becomes the messages it takes, and each answer becomes the core's next event.

Commands to workers (assignments, SuperBatches, moves) and input reads go through the
node's outbox without waiting; their answers arrive on later turns of the node's loop,
and a refusal, a worker gone or no answer is handed back to the core (`assign_failed`,
`read_failed`). Reads of a job's plan, result counts and job-log writes are quick calls
to storage and wait. The node owns the state; this object only acts on it.
"""

from __future__ import annotations

import logging
import time
from collections import deque

import orjson

from shoal.protocol.errors import ProtocolError
from shoal.protocol.size_limits import by_size
from shoal.scheduler import commands as cmd
from shoal.scheduler.job import Job
from shoal.transport.outbox import Request

log = logging.getLogger(__name__)


class CommandDispatch:
    def __init__(self, node):
        self.node = node  # the SchedulerNode: its core, election, outbox, membership and calls

    def run(self, commands: list) -> None:
        todo = deque(commands)
        while todo:  # a command's answer is an event that may return more commands
            todo.extend(self.execute(todo.popleft()))

    def execute(self, c, quiet: bool = True, wait: bool = False) -> list:
        """Carries out one command; returns the core's next commands. A failure is
        logged (the core retries on a later tick) unless `quiet` is off. Commands to
        workers go out without waiting for their answer, unless `wait` (an operator's
        request that should hear of a refusal)."""
        try:
            return self._carry_out(c, wait)
        except (ProtocolError, ValueError) as e:
            if not quiet:
                raise ProtocolError(getattr(e, "code", ProtocolError.INVALID_FIELD), str(e)) from None
            log.warning("[job] %s: %s failed (%s); retrying", c.job_id, type(c).__name__, e)
            return []

    def _carry_out(self, c, wait: bool = False) -> list:
        core, epoch = self.node.core, self.node.election.epoch
        job = core.jobs.get(c.job_id)
        if job is None:
            return []
        if isinstance(c, cmd.ReadInput):
            # Read without waiting (storage may be busy group-committing results); the page
            # is fed to the core when it comes, along with what the core then decides.
            epoch_now = self.node.election.epoch

            def read(page) -> None:
                if self.node.ready_epoch == epoch_now and self.node.election.is_leader():
                    self.run(core.input_read(c.job_id, page["items"], page["checkpoints"], page["next_offset"],
                                              page["offset"]))

            def unread(reply) -> bool:
                log.warning("[job] %s: input from %d not read (%s); retrying", c.job_id, c.offset,
                            f"{reply['code']}: {reply['message']}" if reply is not None else "no answer")
                core.read_failed(c.job_id, c.offset)
                return True

            self.node.outbox.send(Request(lambda: self.node._job_storage(job), "ReadInput",
                                     {"job_id": c.job_id, "offset": c.offset, "limit": c.limit, "pending_only": True},
                                     read, unread, max_tries=2))
            return []
        if isinstance(c, cmd.ReadSuperBatchPlan):
            partitions = self._pages(job, "ReadPartitions", "partitions") if c.partitions else None
            return core.superbatch_state(c.job_id, partitions, self._pages(job, "ReadManifest", "ids"))
        if isinstance(c, cmd.AssignSequences):
            # Items and checkpoints travel in the header: one message per ~512 KiB. If
            # only the reply is lost they are pending again and may run twice: the worker
            # drops an assignment it holds already, storage a second result.
            if (at := self.node.reported_at.pop(c.worker, None)) is not None:
                self.node.decision.add(time.monotonic() - at)
            # A failed one is pending again (`assign_failed`).
            for part in by_size(list(c.assignments), lambda a: len(orjson.dumps(a))):
                self.to_worker(c.worker, "AssignSequences",
                                {"epoch": epoch, "job_id": c.job_id, "sequences": part, "program": job.program,
                                 "args": job.params, "report_to": self.node.advertise, "storage": self.node._job_storage(job)},
                                lambda part=part: core.assign_failed(cmd.AssignSequences(c.worker, c.job_id, tuple(part))))
            return []
        if isinstance(c, cmd.AssignSuperBatches):
            self.to_worker(c.worker, "AssignSuperBatches", {
                "epoch": epoch, "job_id": c.job_id, "storage": self.node._job_storage(job), "report_to": self.node.advertise,
                "superbatches": [{"id": sb["id"], "slices": sb["slices"]} for sb in c.superbatches],
                "encoder": job.params["encoder"]["fingerprint"],
                "vector_dtype": job.params.get("vector_dtype", "float32")}, lambda: core.assign_failed(c))
            return []
        if isinstance(c, cmd.MigrateSequences):
            fields = {"epoch": epoch, "job_id": c.job_id, "to_node": c.target,
                      "to_address": self.node._worker_address(c.target)}
            fields.update({"seq_ids": list(c.seq_ids)} if c.seq_ids is not None else {"count": c.count})
            if wait:
                self.node._call(self.node._worker_address(c.source), "MigrateSequences", fields)
            else:  # one that fails expires in the core, which plans again
                self.to_worker(c.source, "MigrateSequences", fields)
            log.info("[move] %d sequences of %s: %s -> %s", len(c.seq_ids) if c.seq_ids else c.count, c.job_id,
                     c.source, c.target)
            return []
        if isinstance(c, cmd.DropJob):
            self.to_worker(c.worker, "DropJob", {"epoch": epoch, "job_id": c.job_id})
            log.info("[job] %s cancelled: %s drops its sequences", c.job_id, c.worker)
            return []
        if isinstance(c, cmd.CountResults):
            counts = self.node._call(self.node._job_storage(job), "ResultCountQuery", {"job_id": c.job_id})
            return core.results_counted(c.job_id, counts["records"], time.monotonic())
        if isinstance(c, cmd.LogJob):
            self.node._log_job(job)
            return []
        raise TypeError(f"unknown command {c!r}")

    def _pages(self, job: Job, msg_type: str, key: str) -> list:
        out, offset = [], 0
        while True:
            page = self.node._call(self.node._job_storage(job), msg_type, {"job_id": job.job_id, "offset": offset})
            out += page[key]
            if page["next_offset"] >= page["total"] or page["next_offset"] <= offset:
                return out
            offset = page["next_offset"]

    def to_worker(self, wid: str, msg_type: str, fields: dict, failed=None) -> None:
        """Sends a command to a worker without waiting; `failed()` runs if the worker
        refuses it, leaves, or does not answer twice — unless leadership changed since
        (the next leader owns the table)."""
        epoch = self.node.election.epoch

        def address():
            worker = self.node.view.member("worker", wid)
            return worker.info["address"] if worker is not None else None

        def refused(reply) -> bool:
            why = f"{reply['code']}: {reply['message']}" if reply is not None else "no answer, or it left"
            log.warning("[command] %s to %s failed (%s)", msg_type, wid, why)
            if failed is not None and self.node.ready_epoch == epoch and self.node.election.is_leader():
                failed()
            return True

        self.node.outbox.send(Request(address, msg_type, fields, on_error=refused, max_tries=2))
