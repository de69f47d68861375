"""The one thread of a worker process that runs torch: it loads the models, calibrates
and runs the step loop.

Each thread that enters a parallel torch op gets its own OpenMP team, and libgomp
spins between parallel regions only while the threads of all its teams fit the CPUs;
past that it parks them after ~1000 spins, so every parallel region waits for a futex
wake. A decoder loaded on the main thread and stepped on another left two teams on
this 2-core machine: every op of the step ran 30-80% slower (W1 through a local
cluster took +30% over in-process). Loading and stepping on this one thread keeps one
team. Other threads of the worker move bytes and numpy arrays, not torch tensors.
"""

from __future__ import annotations

import queue
import threading
from concurrent.futures import Future


class ComputeThread:
    def __init__(self, name: str = "compute"):
        self._tasks: queue.Queue = queue.Queue()
        # A daemon, as the worker's other threads: a node that exits does not wait for it.
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            fn, args, future = self._tasks.get()
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn(*args))
            except BaseException as e:  # handed to the caller; this thread lives on
                future.set_exception(e)

    def submit(self, fn, *args) -> Future:
        """Runs `fn(*args)` on the compute thread after what was submitted before."""
        future: Future = Future()
        self._tasks.put((fn, args, future))
        return future

    def call(self, fn, *args):
        """`fn(*args)` on the compute thread; its result, or its exception raised here."""
        return self.submit(fn, *args).result()
