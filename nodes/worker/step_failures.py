"""What a worker does when engine steps keep failing, so that a job neither hangs nor
loses more than the one sequence at fault.

A step that raises leaves the engine able to step again (`LLMEngine._recover`: the
sequences it held compute their KV again). Stepping again as before would fail again if
the cause is in the step itself, so each failure halves the number of sequences a step
may hold, down to one; a sequence that fails twice in a step of its own is the cause (a
bug its tokens or its grammar trigger, a prompt whose prefill alone exceeds the device's
memory): it ends with an error that names the failure, and the others go on.

- Out of device memory: the cap stays where steps succeed (the KV sizing's profiled step
  missed something), and the log says so.
- Any other failure: once the sequence at fault has ended, or after `lift_after` steps
  without a failure, the cap is lifted again.
- A device in an error state (a CUDA error other than memory: an illegal address, a
  device-side assert, a lost GPU) fails every later call: the worker leaves the cluster,
  and its sequences resume elsewhere from their checkpoints.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from shoal.protocol.errors import ShoalError

log = logging.getLogger(__name__)

# A sequence alone in this many failed steps is the failure's cause.
SOLO_FAILURES = 2
# Clean steps after which a cap set by a failure other than memory is lifted.
LIFT_AFTER = 256


def out_of_memory(e: BaseException) -> bool:
    """torch.OutOfMemoryError (torch.cuda's too), without importing torch here."""
    return any(c.__name__ == "OutOfMemoryError" for c in type(e).__mro__)


def device_lost(e: BaseException) -> bool:
    """A CUDA error other than memory, here or in what led to it (an error raised while
    handling one): the context is unusable from here on."""
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if not out_of_memory(e):
            text = str(e)
            if (any(c.__name__ == "AcceleratorError" for c in type(e).__mro__)
                    or "CUDA error" in text or "CUBLAS_STATUS" in text or "cudaError" in text):
                return True
        e = e.__cause__ or e.__context__
    return False


class DeviceLost(ShoalError, RuntimeError):
    """The device failed in a way no later step recovers from: the worker must leave.
    `finished`: the records of programs that ended before it was found out (the worker
    still delivers them)."""

    def __init__(self, message: str, finished: list | None = None):
        super().__init__(message)
        self.finished = finished or []


def raise_if_device_lost(e: BaseException) -> None:
    """Raises DeviceLost (from `e`) where `e` says the device is lost."""
    if device_lost(e):
        raise DeviceLost(f"the device is in an error state ({type(e).__name__}: {e})") from e


@dataclass(frozen=True)
class Retry:
    cap: int  # at most this many sequences per step from now on


@dataclass(frozen=True)
class FailSequence:
    seq_id: object
    message: str


@dataclass(frozen=True)
class Leave:
    message: str


class StepFailures:
    def __init__(self, solo_failures: int = SOLO_FAILURES, lift_after: int = LIFT_AFTER):
        self.solo_failures = solo_failures
        self.lift_after = lift_after
        self.memory_cap: int | None = None  # set by running out of memory: it stays
        self.search_cap: int | None = None  # set while looking for a sequence at fault
        self.clean_steps = 0
        self.failures = 0
        self.streak = 0  # failures since the last step that went through
        self._alone: dict = {}  # seq_id -> failed steps it held alone

    @property
    def cap(self) -> int | None:
        """At most this many sequences per step (None: no cap)."""
        caps = [c for c in (self.memory_cap, self.search_cap) if c is not None]
        return min(caps) if caps else None

    def failed(self, rows: list, e: BaseException) -> Retry | FailSequence | Leave:
        """A step holding `rows` (sequence ids) raised `e`: what to do next."""
        self.failures += 1
        self.streak += 1
        self.clean_steps = 0
        what = f"{type(e).__name__}: {e}"
        if device_lost(e):
            return Leave(f"the device is in an error state ({what})")
        if not rows:  # (it held nothing: nothing to bisect)
            return Retry(self.cap)
        if len(rows) == 1:
            sid = rows[0]
            self._alone[sid] = self._alone.get(sid, 0) + 1
            if self._alone[sid] >= self.solo_failures:
                del self._alone[sid]
                self.search_cap = None  # the cause is found: steps run as before
                return FailSequence(sid, f"the engine's step failed {self.solo_failures} times with this "
                                         f"sequence alone in it: {what}")
            self.search_cap = 1
            return Retry(self.cap)
        half = len(rows) // 2
        if out_of_memory(e):
            first = self.memory_cap is None
            self.memory_cap = half if first else min(half, self.memory_cap)
            if first:
                log.warning("[step] out of device memory at %d sequences: steps hold at most %d from now on "
                            "(lower --gpu-memory-utilization or --max-num-seqs to size them at start)",
                            len(rows), half)
        else:
            self.search_cap = half if self.search_cap is None else min(half, self.search_cap)
        return Retry(self.cap)

    def succeeded(self) -> int | None:
        """A step went through: the cap (None: none) steps run under now."""
        self.clean_steps += 1
        self.streak = 0
        if self.search_cap is not None and self.clean_steps >= self.lift_after:
            log.info("[step] %d steps without a failure: the cap of %d sequences is lifted",
                     self.clean_steps, self.search_cap)
            self.search_cap = None
            self._alone.clear()
        return self.cap
