"""The step clock's GPU branch on a stand-in event whose timeline the test sets: a step
that samples nothing, or whose tokens are read a step later, is read once a later step
synchronizes or the device has passed it (no wait of its own), and each step's model and
sampling times come from its own events."""

from __future__ import annotations

import torch

from shoal.nodes.worker.step_clock import StepClock


class FakeEvent:
    """A CUDA event on a device timeline the test moves by hand."""

    now_ms = 0.0  # where the host has queued up to
    done_ms = 0.0  # where the device has got to
    synced = 0

    def record(self):
        self.at = FakeEvent.now_ms

    def synchronize(self):
        FakeEvent.synced += 1

    def query(self):
        return self.at <= FakeEvent.done_ms

    def elapsed_time(self, other):
        return other.at - self.at


def run_step(clock, model_ms, sample_ms, work, synced):
    clock.start()
    FakeEvent.now_ms += model_ms
    clock.model_done()
    FakeEvent.now_ms += sample_ms
    return clock.finish(work, synced)


def test_a_step_that_samples_nothing_is_read_at_the_next_that_does():
    FakeEvent.now_ms, FakeEvent.done_ms, FakeEvent.synced = 0.0, 0.0, 0
    clock = StepClock(torch.device("cuda"), event=FakeEvent)
    assert run_step(clock, 40.0, 1.0, (4096, 0), synced=False) == []
    assert FakeEvent.synced == 0  # the chunk-only step never waited
    got = run_step(clock, 10.0, 3.0, (0, 128), synced=True)
    assert FakeEvent.synced == 1
    assert [w for _, _, w in got] == [(4096, 0), (0, 128)]
    assert [round(m * 1e3, 6) for m, _, _ in got] == [40.0, 10.0]
    assert [round(s * 1e3, 6) for _, s, _ in got] == [1.0, 3.0]
    assert run_step(clock, 5.0, 1.0, (0, 8), synced=True) == [(0.005, 0.001, (0, 8))]


def test_steps_read_a_step_later_are_timed_once_the_device_has_passed_them():
    FakeEvent.now_ms, FakeEvent.done_ms, FakeEvent.synced = 0.0, 0.0, 0
    clock = StepClock(torch.device("cuda"), event=FakeEvent)
    assert run_step(clock, 4.0, 0.5, (0, 256), synced=False) == []
    FakeEvent.done_ms = 3.0  # the device is inside the first step when the second is queued
    assert run_step(clock, 4.0, 0.5, (0, 255), synced=False) == []
    FakeEvent.done_ms = 6.0  # past the first step's end (4.5), inside the second
    got = run_step(clock, 4.0, 0.5, (0, 254), synced=False)
    assert [w for _, _, w in got] == [(0, 256)] and FakeEvent.synced == 0
    assert (round(got[0][0] * 1e3, 6), round(got[0][1] * 1e3, 6)) == (4.0, 0.5)
    FakeEvent.done_ms = 100.0
    got = run_step(clock, 1.0, 0.0, (0, 1), synced=False)
    assert [w for _, _, w in got] == [(0, 255), (0, 254), (0, 1)] and FakeEvent.synced == 0


def test_on_the_cpu_every_step_is_read_at_once():
    clock = StepClock(torch.device("cpu"))
    got = run_step(clock, 0.0, 0.0, (16, 2), synced=False)
    assert len(got) == 1 and got[0][2] == (16, 2) and got[0][0] >= 0 and got[0][1] >= 0
