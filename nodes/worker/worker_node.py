"""The worker node: the coroutine runtime and its engine on a compute thread, sockets
on the IO thread.

Threads, and what each owns:

- IO thread (the node loop): answers every message at once, whatever the model is
  doing; puts `Admit`, `Export` and `Drop` commands (`inbox.py`) on the inbox. It never
  waits on the engine.
- compute thread (`compute_thread.py`): owns the engine, the models and the program
  runner: drains the inbox between steps, steps the engine, runs programs between
  their operations, exports sequences that move and takes in imported ones.
- result writer (`result_writer.py`): delivers checkpoints, results, embeddings and
  moves until acknowledged; a result is reported done only once storage holds it.
- sequence mover (`sequence_mover.py`): sends migrating sequences (state and KV) to
  their targets; `_moved` / `_move_failed` come back on it.
- retrieve thread and its shard-search pool (`retrieve_executor.py`), SuperBatch
  reader (`superbatch_runner.py`), the watchdog (`liveness.py`: leaves when drained,
  exits if the compute thread stalls), the lease keep-alive and etcd's watch callbacks.

Shared between threads: `held` (`held_sequences.py`: the sequence ids held, by job,
behind one lock: the IO thread adds, the writer and the mover release); the job table
`jobs` (written by the IO thread, read by the others); everything else crosses by queue.
"""

from __future__ import annotations

import logging
import os
import queue
import time

from shoal.extras import need

need("torch", "worker", "a worker node")

from shoal.nodes.node import Node, node_arg_parser, open_by_default, parse_node_args, run_node, start_logging
from shoal.transport.sockets import fault_plan
from shoal.protocol.codec import Message, encode
from shoal.protocol.errors import ProtocolError

from shoal.nodes.worker.worker_config import WorkerConfig, add_worker_args, config_from_args, load_decoder, load_encoder
from shoal.nodes.worker.held_sequences import HeldSequences
from shoal.nodes.worker.inbox import Admit, Drop, Export
from shoal.nodes.worker.liveness import Liveness
from shoal.nodes.worker.result_writer import WRITE_TIMEOUT_S, ResultWriter
from shoal.transport.delivery import RpcClients, deliver
from shoal.nodes.worker.program_runner import ProgramRunner
from shoal.nodes.worker.step_failures import DeviceLost, raise_if_device_lost
from shoal.nodes.worker.compute_thread import ComputeThread
from shoal.nodes.worker.sequence_mover import Outbound, SequenceMover
from shoal.scheduler.kv_transfer import decide_kv

log = logging.getLogger(__name__)


class WorkerNode(Node):
    role = "worker"

    def __init__(self, node_id: str, engine, config: WorkerConfig = WorkerConfig(), encoder=None,
                 encoder_cost: dict | None = None,
                 compute: ComputeThread | None = None, **kw):
        """`compute`: the thread that loaded `engine` and `encoder`, to run the step loop
        on (`compute_thread.py`); a new one when they were loaded elsewhere."""
        self.engine = engine
        self.config = config
        self.storage = config.storage  # default storage; an assignment may name its job's own
        self.jobs: dict[str, dict] = {}  # job_id -> {"storage", "report_to"}
        self.held = HeldSequences()  # what a new leader is told this worker holds
        self.epoch = 0  # the newest leader epoch seen; older leaders' commands are refused
        self.inbox: queue.Queue = queue.Queue()  # Admit, Export and Drop commands for the compute thread
        self.link_bytes_per_s = config.link_bytes_per_s  # for the ship-or-re-prefill rule
        self.draining = False
        self.cancelled: set[str] = set()  # jobs dropped: whatever of one comes later is let go in _admit
        self.generation = 0  # bumped when a lost lease makes us drop everything
        # Line-buffered: a benchmark reads it while the node runs.
        self.step_log = open(config.step_log, "a", buffering=1) if config.step_log else None
        # The engine's counters as of its last step (read by the IO thread); its state
        # at start until then, so that a job's stats can be taken as a difference.
        self._engine_snapshot: dict = {"engine": engine.stats_snapshot()} if hasattr(engine, "stats_snapshot") else {}
        cap = {"kv_tokens": engine.blocks.num_blocks * engine.config.block_size, "max_seqs": engine.config.max_num_seqs,
               "max_seq_tokens": engine.max_total_tokens, "dtype": getattr(engine.config, "dtype", None),
               "calibration": engine.cost_model.to_dict() if engine.cost_model else None,
               # What a job's time follows from, with the calibration (`shoal generate --dry-run`).
               "policy": getattr(getattr(engine, "planner", None), "name", engine.config.policy), "budget": engine.config.max_num_batched_tokens,
               "block_size": engine.config.block_size, "chunked_prefill": engine.config.chunked_prefill}
        if encoder is not None:  # the scheduler sends SuperBatches to workers with the job's encoder
            cap["encoder"] = encoder.fingerprint
            cap["encoder_cost"] = encoder_cost  # its cost terms on this device, for predictions
        plan = fault_plan()
        self._stall_after = plan.stall_after_steps if plan is not None else None
        self._embed_retry_at = 0.0  # a failed SuperBatch micro-batch is tried again from then
        if plan is not None and plan.park_at:
            engine.park_at = dict(plan.park_at)
        if plan is not None and plan.step_error:
            from shoal.nodes.worker.step_faults import inject_step_errors

            inject_step_errors(engine, plan.step_error)
        super().__init__(node_id, model=engine.fingerprint, info=cap, **kw)
        self.runner = ProgramRunner(engine, checkpoint_tokens=config.checkpoint_tokens, counters=self.counters)
        if config.allowed_programs is not None:
            self.runner.allowed_programs = config.allowed_programs
        self.view = self.addresses = None
        if self.etcd:  # deliveries follow a storage node that restarts at a new address
            from shoal.nodes.address_book import AddressBook
            from shoal.nodes.membership import MemberView

            self.view = MemberView(self.etcd, self.cluster).start()
            self.addresses = AddressBook(self.view)
        self.encoder = encoder
        self.superbatches = None  # SuperBatches of embedding jobs, on workers with an encoder
        self._reader_clients = RpcClients(self.ctx)  # the SuperBatch reader thread's own sockets
        if encoder is not None:
            from shoal.nodes.worker.embed_executor import EmbedExecutor
            from shoal.nodes.worker.superbatch_runner import SuperBatchRunner

            from shoal.nodes.worker.encode_queue import EncodeQueue

            self.runner.encode_queue = EncodeQueue(encoder, engine, encoder_cost)
            self.runner.executors["embed"] = EmbedExecutor(self.runner.encode_queue)
            self.superbatches = SuperBatchRunner(encoder, self._fetch_texts, counters=self.counters)
        self.retrieve = None
        if self.etcd:  # Retrieve operations search the index shards that storage nodes publish
            from shoal.nodes.worker.index_client import IndexClient
            from shoal.nodes.worker.retrieve_executor import RetrieveExecutor

            self.retrieve = RetrieveExecutor(IndexClient(self.etcd, self.cluster, self.ctx,
                                                         timeout_s=config.retrieve_timeout),
                                             self.runner.encode_queue, window_s=config.retrieve_window_s)
            self.runner.executors["retrieve"] = self.retrieve
        self.mover = SequenceMover(node_id, self.ctx, self._moved, self._move_failed,
                                   lambda job_id: self.jobs.get(job_id, {}))
        self.liveness = Liveness(self, config.stall_timeout)
        if self.registration is not None:
            self.registration.on_rejoin = self.liveness.let_go
        self.compute = compute or ComputeThread()
        self.writer = ResultWriter(node_id, RpcClients(self.ctx), self.jobs, self._storage_of, self.held.release,
                                   self.held_count, self.counters, self._stop,
                                   encoder.fingerprint if encoder is not None else "",
                                   self.superbatches.release if self.superbatches is not None else None)
        self.compute.submit(self._compute_loop).add_done_callback(self._compute_ended)
        self.writer.start()
        self.liveness.start()

    def _compute_ended(self, future) -> None:
        """The step loop only ends by an error: say which (the watchdog then revokes the
        lease if work is held, so the scheduler moves it elsewhere)."""
        if future.exception() is not None:
            log.error("[compute] the step loop died", exc_info=future.exception())

    def handler_table(self) -> dict:
        return {"AssignSequences": self.on_assign, "AssignSuperBatches": self.on_assign_superbatches,
                "HoldingQuery": self.on_holding,
                "MigrateSequences": self.on_migrate, "ImportChunk": self.on_import_chunk,
                "ImportSequence": self.on_import_sequence, "DrainWorker": self.on_drain, "DropJob": self.on_drop_job}

    # -- IO thread -------------------------------------------------------------------------

    def _fence(self, epoch: int) -> None:
        if epoch < self.epoch:
            self.counters["errors.stale_epoch"] += 1
            raise ProtocolError(ProtocolError.STALE_EPOCH, f"epoch {epoch} is older than the current leader's epoch {self.epoch}")
        self.epoch = epoch

    def on_holding(self, msg: Message):
        """A new leader takes over: from now on report to it, and refuse the old one."""
        self._fence(msg["epoch"])
        for job in self.jobs.values():
            job["report_to"] = msg["report_to"]
        jobs = self.held.by_job()
        if self.superbatches is not None:
            for job_id, ids in self.superbatches.held_by_job().items():
                jobs.setdefault(job_id, []).extend(sorted(ids))
        return encode("Holding", {"node_id": self.node_id, "jobs": jobs}, reply_to=msg.id)

    def _refuse_if_draining(self) -> None:
        if self.draining:
            raise ProtocolError(ProtocolError.DRAINING, f"worker {self.node_id} is draining and takes no new work")

    def _take_job(self, msg: Message, from_leader: bool = True) -> None:
        """Where the job's results and progress go. Only the leader's own messages may
        change them: a sequence imported from a peer may carry a deposed leader's address."""
        job = self.jobs.setdefault(msg["job_id"], {})
        job["storage"] = (msg["storage"] if from_leader else "") or job.get("storage") or msg["storage"] or self.storage
        job["report_to"] = (msg["report_to"] if from_leader else "") or job.get("report_to") or msg["report_to"]
        if not job["storage"]:
            raise ProtocolError(ProtocolError.INVALID_FIELD, "no storage node for this job: start with --storage or assign with storage")

    def on_assign(self, msg: Message):
        self._fence(msg["epoch"])
        self._refuse_if_draining()
        for s in msg["sequences"]:
            if not isinstance(s, dict) or "seq_id" not in s:
                raise ProtocolError(ProtocolError.INVALID_FIELD, f"assigned sequence without seq_id: {str(s)[:60]}")
        seqs = self.held.take(msg["job_id"], msg["sequences"])  # a re-sent assignment runs once
        self.counters["sequences.duplicate"] += len(msg["sequences"]) - len(seqs)
        self._take_job(msg)
        if seqs:
            self.inbox.put(Admit(msg["job_id"], msg["program"], msg["args"], seqs))
        self.counters["sequences.assigned"] += len(seqs)
        return encode("AssignAck", {"job_id": msg["job_id"], "accepted": len(seqs), "refused": []}, reply_to=msg.id)

    def on_assign_superbatches(self, msg: Message):
        """SuperBatches of an embedding job: the reader thread fetches their texts."""
        self._fence(msg["epoch"])
        self._refuse_if_draining()
        if self.superbatches is None:
            raise ProtocolError(ProtocolError.INVALID_FIELD, f"worker {self.node_id} hosts no encoder (start it with --encoder)")
        if msg["encoder"] != self.encoder.fingerprint:
            raise ProtocolError(ProtocolError.INVALID_FIELD, f"the job's encoder is {msg['encoder']}; worker "
                                f"{self.node_id} hosts encoder {self.encoder.fingerprint} ({self.encoder.folder})")
        for sb in msg["superbatches"]:
            if not isinstance(sb, dict) or not isinstance(sb.get("id"), str) or not isinstance(sb.get("slices"), list):
                raise ProtocolError(ProtocolError.INVALID_FIELD, f"SuperBatch without an id or slices: {str(sb)[:60]}")
        self._take_job(msg)
        taken = sum(self.superbatches.assign(msg["job_id"], sb, msg["vector_dtype"]) for sb in msg["superbatches"])
        self.counters["superbatches.duplicate"] += len(msg["superbatches"]) - taken
        return encode("AssignAck", {"job_id": msg["job_id"], "accepted": taken, "refused": []}, reply_to=msg.id)

    def _fetch_texts(self, job_id: str, slices: list) -> list | None:
        """Reader thread: a SuperBatch's (id, text) rows from the job's storage node."""
        from shoal.protocol.arrow_table import table_from_ipc

        job = self.jobs.get(job_id, {})
        reply = deliver(self._reader_clients, lambda: self._storage_of(job), "ReadTexts",
                        {"job_id": job_id, "slices": slices}, self._stop, timeout=WRITE_TIMEOUT_S,
                        what=f"a text read of {job_id}")
        if reply is None:
            if self._stop.is_set():  # abandoned: the node is stopping
                return None
            raise RuntimeError(f"no storage node to read {job_id}'s texts from")  # the reader logs it and retries
        table = table_from_ipc(reply.blobs["table"])
        return list(zip(table["id"].to_pylist(), table["text"].to_pylist()))

    def on_migrate(self, msg: Message):
        """The scheduler moves some of this worker's sequences: the compute thread
        exports them and the mover sends them; each is reported as moved once the
        target holds it."""
        self._fence(msg["epoch"])
        if msg["to_node"] == self.node_id:
            raise ProtocolError(ProtocolError.INVALID_FIELD, f"cannot migrate sequences of {self.node_id} to itself")
        self.inbox.put(Export(msg["job_id"], msg["seq_ids"], msg["count"], msg["to_node"], msg["to_address"]))
        accepted = len(msg["seq_ids"]) if msg["seq_ids"] else msg["count"]
        return encode("MigrateAck", {"job_id": msg["job_id"], "accepted": accepted}, reply_to=msg.id)

    def on_import_chunk(self, msg: Message):
        self._refuse_if_draining()
        self.mover.take_chunk(msg["transfer_id"], msg["index"], msg.blobs["data"])
        return encode("ImportChunkAck", {"transfer_id": msg["transfer_id"], "index": msg["index"]}, reply_to=msg.id)

    def on_import_sequence(self, msg: Message):
        """Another worker hands over a sequence: checked here, so a state this worker
        cannot continue is refused and stays at its source."""
        self._refuse_if_draining()
        seq = msg["sequence"]
        state = seq.get("state") if isinstance(seq, dict) else None
        if not isinstance(state, dict) or "seq_id" not in seq or not isinstance(seq.get("item"), dict):
            raise ProtocolError(ProtocolError.INVALID_FIELD, "ImportSequence needs a sequence with seq_id, item and state")
        if state.get("fingerprint") != self.engine.fingerprint:
            raise ProtocolError(ProtocolError.INVALID_FIELD, f"sequence {seq['seq_id']!r}: state is from model "
                                f"{state.get('fingerprint')!r}, this worker runs {self.engine.fingerprint!r}")
        if self.held.holds(msg["job_id"], seq["seq_id"]):  # a re-sent import is taken once
            return encode("ImportAck", {"job_id": msg["job_id"], "seq_id": seq["seq_id"]}, reply_to=msg.id)
        kv = self.mover.assemble(msg["transfer_id"], msg["chunks"])
        self._take_job(msg, from_leader=False)
        if self.held.take(msg["job_id"], [seq]):
            self.inbox.put(Admit(msg["job_id"], msg["program"], msg["args"], [seq], {seq["seq_id"]: kv}))
            self.counters["sequences.imported"] += 1
        return encode("ImportAck", {"job_id": msg["job_id"], "seq_id": seq["seq_id"]}, reply_to=msg.id)

    def on_drop_job(self, msg: Message):
        """The job was cancelled: the compute thread stops its sequences and lets them go
        (results finished before are still stored)."""
        self._fence(msg["epoch"])
        if msg["job_id"] not in self.cancelled:
            self.cancelled.add(msg["job_id"])
            self.inbox.put(Drop(msg["job_id"]))
        return encode("OpsAck", {"detail": {"node_id": self.node_id, "job_id": msg["job_id"]}}, reply_to=msg.id)

    def on_drain(self, msg: Message):
        """Stop taking work; the scheduler moves what is held; when nothing is left
        (results stored, transfers done) the worker leaves the cluster and exits."""
        self._fence(msg["epoch"])
        if not self.draining:
            log.info("[drain] %s: draining (holding %d sequences)", self.node_id, self.held_count())
        self.draining = True
        return encode("OpsAck", {"detail": {"held": self.held_count()}}, reply_to=msg.id)

    def stats(self) -> dict:
        resident = len(self.runner)
        in_engine = len(self.engine.seqs)
        return {**super().stats(), "inbox": self.inbox.qsize(), "unwritten": self.writer.results.qsize(),
                "draining": self.draining, "checkpoint_s": self.runner.checkpoint_seconds,
                "sequences": {"resident": resident, "in_engine": in_engine, "waiting_on_ops": resident - in_engine,
                              "moving": self.mover.busy, "parked": [key[1] for key in self.engine.parked],
                              "offloaded": sum(1 for q in self.engine.waiting if q.host_kv is not None)},
                **({"superbatches": {"held": len(self.superbatches.held), "ready": len(self.superbatches.ready),
                                     "texts_buffered": self.superbatches.texts_buffered,
                                     "highwater": dict(self.superbatches.highwater)}} if self.superbatches else {}),
                **({"retrieve": {**self.retrieve.stats, "failovers": self.retrieve.client.failovers}}
                   if self.retrieve is not None else {}),
                **({"encode": dict(self.runner.encode_queue.stats)} if self.runner.encode_queue is not None else {}),
                **self._engine_snapshot}

    # -- compute thread --------------------------------------------------------------------

    def _admit(self, cmd: Admit) -> None:
        job_id, program, args, kvs = cmd.job_id, cmd.program, cmd.args, cmd.kv
        if job_id in self.cancelled:  # queued before the drop, re-sent, imported, or back from a failed move
            self.held.release(job_id, [s["seq_id"] for s in cmd.sequences])
            self.counters["sequences.dropped"] += len(cmd.sequences)
            return
        for s in cmd.sequences:
            item = s.get("item")
            if item is None:  # a protocol 1.2 scheduler sends the generate program's fields
                program, args = "generate", s.get("params", {})
                item = {"prompt": s.get("prompt"), "prompt_token_ids": s.get("prompt_token_ids")}
            # Refused input is a result too: the job records the error, nothing is lost.
            for done in self.runner.admit(job_id, program, args, {**item, "id": s["seq_id"]}, s.get("state"),
                                          kvs.get(s["seq_id"])):
                self.writer.put(self.writer.results, done)
                self.counters["sequences.refused"] += 1

    def _export(self, cmd: Export) -> None:
        """Takes sequences out of the engine and hands them to the mover, with their KV
        when shipping it beats the target prefilling it again."""
        job_id, to_node, to_address = cmd.job_id, cmd.to_node, cmd.to_address
        keys = [(job_id, s) for s in cmd.seq_ids if (job_id, s) in self.runner.coros] if cmd.seq_ids \
            else self.runner.movable(job_id, cmd.count)
        for key in keys:
            program, args, item = self.runner.describe(key)
            try:
                state, kv = self.runner.export(key)
            except Exception:  # it stays here, running
                log.exception("[migrate] export of %s failed", key)
                continue
            if kv is not None:
                decision = decide_kv(len(kv), state["kv_tokens"], self.link_bytes_per_s, self.engine.cost_model)
                if not decision.ship:
                    kv, state["kv_tokens"] = None, 0
                self.counters["kv.shipped" if decision.ship else "kv.dropped"] += 1
            self.mover.send(Outbound(job_id, program, args, {"seq_id": key[1], "item": item, "state": state},
                                     kv, to_node, to_address, self.generation))
        self.counters["migrations.started"] += len(keys)

    def _drop(self, cmd: Drop) -> None:
        keys = [key for key in self.runner.coros if key[0] == cmd.job_id]
        for key in keys:
            self.runner.abort(key)
        self.held.release(cmd.job_id, [key[1] for key in keys])
        self.counters["sequences.dropped"] += len(keys)
        log.info("[job] %s cancelled: dropped %d sequences", cmd.job_id, len(keys))

    def _moved(self, job_id: str, seq_id, to_node: str, generation: int) -> None:
        """Mover thread: the target holds the sequence; let it go and tell the scheduler."""
        if generation != self.generation:  # we rejoined meanwhile: what we hold now is new work
            return
        self.held.release(job_id, [seq_id])
        self.counters["migrations.done"] += 1
        self.writer.put(self.writer.moved, (job_id, seq_id, to_node))

    def _move_failed(self, out: Outbound) -> None:
        """Mover thread: the transfer failed, so the sequence continues here."""
        self.counters["migrations.failed"] += 1
        if out.generation != self.generation:  # we rejoined meanwhile: it was placed again elsewhere
            return
        self.inbox.put(Admit(out.job_id, out.program, out.args, [out.sequence], {out.sequence["seq_id"]: out.kv}))

    def _drain_inbox(self) -> None:
        """Admits every waiting assignment; waits briefly for one when the engine is idle."""
        try:
            item = self.inbox.get(timeout=0.1) if not self._has_work() else self.inbox.get_nowait()
        except queue.Empty:
            return
        while True:
            if isinstance(item, Admit):
                self._admit(item)
            elif isinstance(item, Drop):
                self._drop(item)
            else:
                self._export(item)
            try:
                item = self.inbox.get_nowait()
            except queue.Empty:
                return

    def _compute_loop(self) -> None:
        steps = 0
        while not self._stop.is_set():
            self.liveness.beat()
            if self.liveness.reset_requested():
                self.liveness.drop_everything()
            if self._stall_after is not None and steps >= self._stall_after:
                time.sleep(3600)  # injected fault: a wedged step loop (the watchdog must notice)
            try:
                self._drain_inbox()
            except Exception:  # a bug in admission must not stop the compute thread
                self.counters["errors.admit"] += 1
                log.exception("[admit] failed")
            if not self._has_work():
                continue
            t = time.perf_counter()
            # Embedding and generation fail apart: a SuperBatch that fails (and waits half a
            # second before it is tried again) does not stop generation, nor the reverse.
            embedding = (self.superbatches is not None and self.superbatches.has_work()
                         and time.monotonic() >= self._embed_retry_at)
            if not embedding and not self.runner.has_work():
                time.sleep(0.01)  # (a SuperBatch waits to be tried again, and nothing else is here)
                continue
            try:
                if embedding:
                    try:
                        for work, blob in self.superbatches.step():
                            self.writer.put(self.writer.embedded, (work.job_id, work, blob))
                    except Exception as e:
                        raise_if_device_lost(e)
                        self.counters["errors.superbatch"] += 1
                        log.exception("[embed] a micro-batch failed; tried again in 0.5 s")
                        self._embed_retry_at = time.monotonic() + 0.5
                finished = self.runner.step(idle_wait=not embedding) if self.runner.has_work() else []
            except DeviceLost as e:  # every later step would fail too: its work goes elsewhere
                for done in e.finished:  # (delivered still: storage keeps the first of each)
                    self.writer.put(self.writer.results, done)
                self.counters["errors.device_lost"] += 1
                log.critical("[step] %s: leaving the cluster; this worker's sequences resume elsewhere", e)
                self.liveness.leave(exit_code=5)  # (3: the watchdog)
                return
            except Exception:  # a bug outside the engine's step (which recovers by itself)
                self.counters["errors.step"] += 1
                log.exception("[step] the step loop failed")
                time.sleep(0.5)
                continue
            for done in finished:
                self.writer.put(self.writer.results, done)
            for ckpt in self.runner.checkpoints:
                self.writer.put(self.writer.checkpoints, ckpt)
            self.runner.checkpoints.clear()
            steps += 1
            if self.step_log is not None:
                self.step_log.write(f"{time.time():.6f} {time.perf_counter() - t:.6f}\n")
            self._engine_snapshot = {"engine": self.engine.stats_snapshot()}

    def _has_work(self) -> bool:
        return self.runner.has_work() or (self.superbatches is not None and self.superbatches.has_work())

    # -- result writer thread ----------------------------------------------------------------

    def _storage_of(self, job: dict) -> str:
        """A job's storage node where it is now (the assignment may name an address it left)."""
        address = job.get("storage") or self.storage
        return self.addresses.current(address, "storage") if self.addresses is not None and address else address

    def close(self) -> None:
        if self.view is not None:
            self.view.stop()
        if self.retrieve is not None:
            self.retrieve.close()
        if self.superbatches is not None:
            self.superbatches.close()
        self.mover.close()
        if not self.writer.join(2.0):
            log.warning("[shutdown] the result writer is still delivering; closing its sockets anyway")
        super().close()

    def held_count(self) -> int:
        """Sequences this worker holds: queued in the inbox or in the engine."""
        return sum(len(item.sequences) for item in list(self.inbox.queue) if isinstance(item, Admit)) + len(self.runner)


def main(argv: list[str] | None = None) -> int:
    ap = node_arg_parser("worker")
    add_worker_args(ap)
    args = parse_node_args(ap, argv)
    if not (args.model or args.encoder):
        ap.error("give --model (a decoder), --encoder, or both")
    node_id = args.node_id or f"worker-{os.getpid()}"
    start_logging("worker", node_id)
    compute = ComputeThread()  # every model is loaded, calibrated and run on it
    # The encoder first: on a GPU the decoder's KV cache takes what the device has left
    # after everything else it holds (docs/gpu.md), so the encoder's weights are counted
    # there (its batches' activations come out of the margin the utilization leaves).
    encoder, encoder_cost = compute.call(load_encoder, args) if args.encoder else (None, None)
    engine = compute.call(load_decoder, args)
    config = config_from_args(args, open_by_default(args))
    node = WorkerNode(node_id, engine, config, encoder=encoder, encoder_cost=encoder_cost, compute=compute,
                      bind=args.bind, etcd=args.etcd, cluster=args.cluster, advertise=args.advertise)
    return run_node(node, args.metrics_port, args.metrics_host)


if __name__ == "__main__":
    raise SystemExit(main())
