"""How long a step's model and its sampling took, on any device.

On a CPU the host clock says it. On a GPU the host only queues the model's kernels and
returns at once; the sampler's read of the chosen tokens is where it waits. So the
split is taken from CUDA events on the stream: one before the model, one after it, one
when the step ends; model time is the first gap, sampling (with whatever the host did
before the step ended) the second. They are read once a step has synchronized anyway:
a step that samples nothing (every row a chunk of a longer prompt), or one whose tokens
are read a step later (async scheduling), never waits for the device, so its events are
kept and read once the device has passed them. No extra wait.
"""

from __future__ import annotations

import time

import torch


class StepClock:
    def __init__(self, device: torch.device, event=None):
        """`event`: the timing event's class (torch.cuda.Event; a test gives its own)."""
        self.gpu = device.type == "cuda"
        self._event = event or (lambda: torch.cuda.Event(enable_timing=True))
        self._pending: list[tuple] = []  # (events, work) of GPU steps that did not synchronize

    def start(self) -> None:
        self.t0 = time.perf_counter()
        if self.gpu:
            self.e0, self.e1 = self._event(), self._event()
            self.e0.record()

    def model_done(self) -> None:
        if self.gpu:
            self.e1.record()
        self.t1 = time.perf_counter()

    def finish(self, work, synced: bool) -> list[tuple[float, float, object]]:
        """(model seconds, sampling seconds, `work`) of each step whose times are known
        now: this one's and earlier ones' once a step synchronizes (`synced`: it read its
        tokens back from the device), else those the device has passed."""
        if not self.gpu:
            return [(self.t1 - self.t0, time.perf_counter() - self.t1, work)]
        end = self._event()
        end.record()
        self._pending.append(((self.e0, self.e1, end), work))
        if synced:
            end.synchronize()  # at once: the stream ran dry when the tokens were read
            done, self._pending = self._pending, []
        else:
            passed = 0
            while passed < len(self._pending) and self._pending[passed][0][2].query():
                passed += 1
            done, self._pending = self._pending[:passed], self._pending[passed:]
        return [(e0.elapsed_time(e1) / 1e3, e1.elapsed_time(e2) / 1e3, w) for (e0, e1, e2), w in done]
