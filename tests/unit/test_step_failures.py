"""The worker's answer to failing steps (`step_failures.py`): bisect down to the
sequence at fault and end it alone; keep a memory cap; leave on a lost device."""

from __future__ import annotations

from shoal.nodes.worker.step_failures import FailSequence, Leave, Retry, StepFailures, device_lost, out_of_memory


class OutOfMemoryError(RuntimeError):  # as torch names it (torch is not imported by unit tests)
    pass


def test_failures_halve_the_step_down_to_the_sequence_at_fault_which_alone_ends():
    f = StepFailures(solo_failures=2, lift_after=10)
    bug = ValueError("bad token")
    assert f.failed(list(range(8)), bug) == Retry(4)
    assert f.failed(list(range(4)), bug) == Retry(2)
    assert f.failed([2, 3], bug) == Retry(1)
    assert f.failed([3], bug) == Retry(1)  # once alone may be chance
    verdict = f.failed([3], bug)
    assert isinstance(verdict, FailSequence) and verdict.seq_id == 3
    assert "2 times" in verdict.message and "ValueError: bad token" in verdict.message
    assert f.cap is None and f.succeeded() is None  # found: steps run as before


def test_a_cap_set_by_another_failure_is_lifted_after_clean_steps():
    f = StepFailures(lift_after=3)
    assert f.failed(list(range(6)), ValueError("x")) == Retry(3)
    assert [f.succeeded() for _ in range(3)] == [3, 3, None]


def test_out_of_memory_keeps_its_cap_and_only_lowers_it():
    f = StepFailures(lift_after=2)
    oom = OutOfMemoryError("CUDA out of memory")
    assert f.failed(list(range(64)), oom) == Retry(32)
    assert all(f.succeeded() == 32 for _ in range(10))
    assert f.failed(list(range(32)), oom) == Retry(16)
    assert f.failed(list(range(5)), ValueError("x")) == Retry(2)  # never above the memory cap
    # A sequence too large alone ends; the memory cap stays for the others.
    assert f.failed([7], oom) == Retry(1)
    assert isinstance(f.failed([7], oom), FailSequence) and f.cap == 16


def test_a_lost_device_is_left_and_memory_is_not_a_lost_device():
    f = StepFailures()
    lost = RuntimeError("CUDA error: an illegal memory access was encountered")
    verdict = f.failed([1, 2], lost)
    assert isinstance(verdict, Leave) and "illegal memory access" in verdict.message
    assert device_lost(lost) and not device_lost(ValueError("x"))
    assert out_of_memory(OutOfMemoryError("CUDA error: out of memory")) and not device_lost(
        OutOfMemoryError("CUDA error: out of memory"))


def test_a_streak_counts_failures_since_the_last_clean_step():
    f = StepFailures()
    f.failed([1, 2], ValueError("x"))
    f.failed([1], ValueError("x"))
    assert f.streak == 2 and f.failures == 2
    f.succeeded()
    assert f.streak == 0 and f.failures == 2
    assert StepFailures().failed([], ValueError("x")) == Retry(None)  # a step that held nothing caps nothing
