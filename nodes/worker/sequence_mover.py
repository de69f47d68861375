"""Moving sequences between workers: the sending side's thread and the receiving side's
chunk assembly.

A sequence leaves its worker as data (`ProgramRunner.export`: its journal, current
operation, tokens so far and, when worth shipping, its KV blob). The mover sends the
blob in `ImportChunk`s (so no message nears the size cap) and then `ImportSequence`;
only when the target acknowledges does the source let the sequence go and report the
move to the scheduler. A transfer that fails midway hands the sequence back to the
source's compute thread, which continues it there: never lost. If only the ack was
lost, both run it and storage keeps the first result: never visible twice.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
import uuid
from dataclasses import dataclass

from shoal.protocol.errors import ProtocolError
from shoal.transport.delivery import RpcClients

log = logging.getLogger(__name__)

CHUNK_BYTES = 4 << 20
TRANSFER_TIMEOUT_S = 10.0
STALE_TRANSFER_S = 300.0  # chunks of a transfer that never completed are dropped after this


@dataclass
class Outbound:
    job_id: str
    program: str
    args: dict
    sequence: dict  # {"seq_id", "item", "state"}
    kv: bytes | None
    to_node: str
    to_address: str
    generation: int = 0  # the worker's generation when it left (a rejoin bumps it)


class SequenceMover:
    def __init__(self, node_id: str, ctx, on_moved, on_failed, job_info):
        """`on_moved(job_id, seq_id, to_node, generation)` runs once the target holds it;
        `on_failed(outbound)` gives a sequence back; `job_info(job_id)` is the job's
        {"storage", "report_to"}, which the target needs too."""
        self.node_id, self.ctx = node_id, ctx
        self.on_moved, self.on_failed, self.job_info = on_moved, on_failed, job_info
        self.outbox: queue.Queue = queue.Queue()
        self.busy = 0  # sequences queued or in transfer
        self._clients = RpcClients(ctx)  # the mover thread's own sockets
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sequence-mover", daemon=True)
        self._thread.start()
        self.incoming: dict[str, tuple[float, dict[int, bytes]]] = {}  # transfer id -> (started, chunks)

    # -- sending (its own thread) -----------------------------------------------------------

    def send(self, out: Outbound) -> None:
        self.busy += 1
        self.outbox.put(out)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                out = self.outbox.get(timeout=0.2)
            except queue.Empty:
                continue
            try:
                self._transfer(out)
                self.on_moved(out.job_id, out.sequence["seq_id"], out.to_node, out.generation)
            except Exception as e:  # whatever went wrong, the sequence must not be lost
                log.warning("[migrate] %s of %s to %s failed (%s); it continues here", out.sequence["seq_id"],
                            out.job_id, out.to_node, e)
                self.on_failed(out)
            finally:
                self.busy -= 1

    def _transfer(self, out: Outbound) -> None:
        rpc = self._clients(out.to_address)
        tid = f"{self.node_id}-{uuid.uuid4().hex[:12]}"
        chunks = [out.kv[i:i + CHUNK_BYTES] for i in range(0, len(out.kv), CHUNK_BYTES)] if out.kv else []
        for i, data in enumerate(chunks):
            rpc.request("ImportChunk", {"transfer_id": tid, "index": i}, {"data": data},
                        timeout=TRANSFER_TIMEOUT_S, retries=2)
        info = self.job_info(out.job_id)
        rpc.request("ImportSequence", {"transfer_id": tid, "job_id": out.job_id, "program": out.program,
                                       "args": out.args, "sequence": out.sequence, "chunks": len(chunks),
                                       "storage": info.get("storage", ""), "report_to": info.get("report_to", "")},
                    timeout=TRANSFER_TIMEOUT_S, retries=2)

    # -- receiving (the IO thread) ----------------------------------------------------------

    def take_chunk(self, transfer_id: str, index: int, data: bytes) -> None:
        now = time.monotonic()
        for tid in [t for t, (started, _) in self.incoming.items() if now - started > STALE_TRANSFER_S]:
            del self.incoming[tid]
        self.incoming.setdefault(transfer_id, (now, {}))[1][index] = data

    def assemble(self, transfer_id: str, chunks: int) -> bytes | None:
        """The transfer's KV blob (None if it had none); its chunks are let go."""
        if not chunks:
            return None
        got = self.incoming.get(transfer_id, (0, {}))[1]
        missing = [i for i in range(chunks) if i not in got]
        if missing:
            raise ProtocolError(ProtocolError.INVALID_FIELD,
                                f"transfer {transfer_id}: KV chunk(s) {missing[:5]} of {chunks} never arrived")
        self.incoming.pop(transfer_id, None)
        return b"".join(got[i] for i in range(chunks))

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
