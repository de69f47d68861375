"""How weight streaming's copies run beside compute: one interface, two devices.

`WeightStreamer` (weight_streamer.py) asks for three things: start a layer's copy into
a slot ahead of use, make a layer's weights readable before it computes, and say when
the compute has moved past a slot, so the next copy into it may begin. It also wants the
copy bandwidth, measured on the copies alone.

- `ThreadCopies` (a CPU): compute is synchronous on the compute thread, so a slot is free
  as soon as the thread has moved on; a copy runs on a thread of its own, and making a
  layer readable waits for its copy on the host. Each copy is timed where it runs.
- `StreamCopies` (a GPU): copies are issued on a CUDA stream of their own, so they
  overlap the kernels of the compute stream. Before a copy into a slot, the copy stream
  waits on an event the compute stream recorded after the last layer that read that
  slot (a slot is never overwritten while a layer reads it); before a layer computes,
  the compute stream waits on its copy's event (the host never blocks, and compute waits
  only for the copy it needs). The bandwidth is read from timing events recorded on the
  copy stream around each copy, once the copy is done.

A handle is what `start` returns and `use` takes: the copy function's result and how to
wait for it.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable

import torch

CopyFn = Callable[[], tuple[int, bool]]  # issues a layer's copies; returns (bytes, experts included)


class ThreadCopies:
    def __init__(self):
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="weight-fetch")
        self._lock = threading.Lock()  # copies are timed on the copy thread and the compute thread
        self.bytes, self.seconds = 0, 0.0

    def _timed(self, copy: CopyFn) -> tuple[int, bool]:
        t = time.perf_counter()
        out = copy()
        with self._lock:
            self.seconds += time.perf_counter() - t
            self.bytes += out[0]
        return out

    def compute_moved_on(self) -> None:
        """(Compute is synchronous here: every slot behind the compute thread is free.)"""

    def start(self, copy: CopyFn) -> Future:
        return self._pool.submit(self._timed, copy)

    def now(self, copy: CopyFn) -> Future:
        """A copy done before this returns (the first fetch, an on-demand one)."""
        done = Future()
        done.set_result(self._timed(copy))
        return done

    def use(self, handle: Future) -> tuple[int, bool]:
        return handle.result()

    def measured(self) -> tuple[int, float]:
        with self._lock:
            return self.bytes, self.seconds

    def close(self) -> None:
        self._pool.shutdown(wait=True)


class StreamHandle:
    def __init__(self, result: tuple[int, bool], done: "torch.cuda.Event"):
        self.result, self.done = result, done


class StreamCopies:
    def __init__(self, device: torch.device):
        self.device = device
        self.stream = torch.cuda.Stream(device)
        self.compute = torch.cuda.current_stream(device)
        # What the compute stream queued before (the slots' zero fill) comes before any copy.
        self.stream.wait_stream(self.compute)
        self._freed = None  # the compute stream's event after the layers issued so far
        self._timing: list[tuple[torch.cuda.Event, torch.cuda.Event, int]] = []
        self.bytes, self.seconds = 0, 0.0

    def compute_moved_on(self) -> None:
        """Marks the compute stream: every layer issued before now, and the slot it read,
        is done once this event is. The next copy into such a slot waits on it."""
        self._freed = torch.cuda.Event()
        self._freed.record(self.compute)

    def start(self, copy: CopyFn) -> StreamHandle:
        with torch.cuda.stream(self.stream):
            if self._freed is not None:
                self.stream.wait_event(self._freed)
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record(self.stream)
            result = copy()  # non-blocking copies from pinned host memory, on this stream
            end.record(self.stream)
        self._timing.append((begin, end, result[0]))
        if len(self._timing) > 256:  # fold the finished ones in: the list stays short whoever reads it
            self.measured()
        return StreamHandle(result, end)

    now = start  # the compute stream waits for it in `use` either way: the host need not

    def use(self, handle: StreamHandle) -> tuple[int, bool]:
        self.compute.wait_event(handle.done)
        return handle.result

    def measured(self) -> tuple[int, float]:
        """Bytes and seconds of the copies done so far, from the copy stream's events."""
        pending = []
        for begin, end, nbytes in self._timing:
            if end.query():
                self.seconds += begin.elapsed_time(end) / 1e3
                self.bytes += nbytes
            else:
                pending.append((begin, end, nbytes))
        self._timing = pending
        return self.bytes, self.seconds

    def close(self) -> None:
        self.stream.synchronize()


def copies_for(device: torch.device) -> ThreadCopies | StreamCopies:
    return StreamCopies(device) if device.type == "cuda" else ThreadCopies()
