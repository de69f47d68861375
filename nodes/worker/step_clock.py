"""How long a step's model and its sampling took, on any device.

On a CPU the host clock says it. On a GPU the host only queues the model's kernels and
returns at once; the sampler's read of the chosen tokens is where it waits. So the
split is taken from two CUDA events recorded on the stream around the model, read once
the step has synchronized anyway (no extra wait), and sampling is the rest of the
step's wall time.
"""

from __future__ import annotations

import time

import torch


class StepClock:
    def __init__(self, device: torch.device):
        self.gpu = device.type == "cuda"

    def start(self) -> None:
        self.t0 = time.perf_counter()
        if self.gpu:
            self.e0, self.e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            self.e0.record()

    def model_done(self) -> None:
        if self.gpu:
            self.e1.record()
        self.t1 = time.perf_counter()

    def finish(self) -> tuple[float, float]:
        """(model seconds, sampling seconds), after the step has read its tokens back."""
        wall = time.perf_counter() - self.t0
        if self.gpu:
            self.e1.synchronize()  # already passed: the sampler read the tokens after it
            model = min(wall, self.e0.elapsed_time(self.e1) / 1e3)
        else:
            model = self.t1 - self.t0
        return model, wall - model
