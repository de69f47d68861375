"""A worker's liveness: the watchdog thread, letting go of its work when its lease was
lost, and leaving the cluster once a drain has moved everything away.

- The compute loop `beat()`s every turn. A loop that stops beating for `stall_timeout`
  seconds while holding work revokes the node's lease and stops the process: a wedged
  worker must not look alive because its keep-alive thread still runs. Its work is
  placed elsewhere.
- When the lease expired (the process was frozen or cut off), the scheduler has placed
  this worker's work elsewhere: `let_go` (on the lease thread) asks the compute thread
  to drop everything before the node registers again as a new incarnation (a result
  already computed is still written, and its sequence held until then, so that placed
  here again it is not run twice: storage keeps the first).
- A draining worker that holds nothing (no sequence, no SuperBatch, no transfer, nothing
  unwritten) leaves the cluster and exits.
"""

from __future__ import annotations

import logging
import queue
import threading
import time

from shoal.nodes.worker.inbox import Admit

log = logging.getLogger(__name__)


class Liveness:
    def __init__(self, node, stall_timeout: float):
        self.node = node  # the WorkerNode: what it holds, its registration, its stop
        self.stall_timeout = stall_timeout
        self.last_progress = time.monotonic()  # the compute loop's last sign of life
        self._reset = threading.Event()
        self._reset_done = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="watchdog", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def beat(self) -> None:
        self.last_progress = time.monotonic()

    def reset_requested(self) -> bool:
        return self._reset.is_set()

    def let_go(self) -> None:
        """Lease thread: have the compute thread drop everything, and wait until it has."""
        self._reset_done.clear()
        self._reset.set()
        if not self._reset_done.wait(timeout=60):
            log.error("[rejoin] the compute thread did not drop its work within 60 s")

    def drop_everything(self) -> None:
        """Compute thread: everything held, queued or in the engine, is let go."""
        node = self.node
        dropped = node.runner.drop_all() + (node.superbatches.drop_all() if node.superbatches is not None else 0)
        while True:
            try:
                item = node.inbox.get_nowait()
                dropped += len(item.sequences) if isinstance(item, Admit) else 0
            except queue.Empty:
                break
        # A finished sequence whose result is not stored yet stays held: the new leader may
        # place it again (storage has no result for it) and it must not run twice here.
        kept = node.held.keep_only(node.writer.unwritten())
        node.generation += 1
        node.counters["sequences.dropped_on_rejoin"] += dropped
        log.warning("[rejoin] lease lost: dropped %d held sequences (%d finished, still held until stored); "
                    "registering again", dropped, kept)
        self._reset.clear()
        self._reset_done.set()

    def drained(self) -> bool:
        node = self.node
        superbatches = node.superbatches is not None and bool(node.superbatches.held)
        return not (node.held.any() or superbatches or node.runner.has_work() or node.inbox.qsize()
                    or node.mover.busy or node.writer.busy())

    def leave(self, exit_code: int = 0) -> None:
        if self.node.registration is not None:
            self.node.registration.stop(revoke=True)
        self.node.exit_code = exit_code
        self.node.stop()

    def _watch(self) -> None:
        node = self.node
        while not node._stop.wait(1.0):
            if node.draining and self.drained():
                log.info("[drain] %s holds nothing: leaving the cluster", node.node_id)
                self.leave()
                return
            stalled = time.monotonic() - self.last_progress
            if stalled > self.stall_timeout and node._has_work():
                log.error("[watchdog] no step for %.0f s with work held: revoking the lease and stopping", stalled)
                node.counters["watchdog.stalls"] += 1
                self.leave(exit_code=3)
                return
