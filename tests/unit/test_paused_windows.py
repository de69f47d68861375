"""Pairing a worker's steps with the windows in which the other processes ran or were
paused (scripts/paused_windows.py)."""

import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

from paused_windows import running_over_paused, step_states, window_state  # noqa: E402


def test_a_step_belongs_to_a_window_only_when_no_flip_falls_inside_it():
    flips = [(10.0, True), (12.0, False), (14.0, True)]
    assert window_state(flips, 9.0) is None
    assert window_state(flips, 11.0) is True
    assert window_state(flips, 13.0) is False
    # (end, seconds): wholly paused, straddling the flip at 12, wholly running, before any flip
    steps = [(11.5, 1.0), (12.5, 1.0), (13.9, 1.0), (9.5, 0.5)]
    assert step_states(steps, flips) == [True, None, False, None]


def test_running_steps_are_compared_with_their_paused_neighbours():
    # Steps of 0.1 s that grow 1% a step (a job's phase changes); while the others run,
    # steps take 5% longer. Flips every 1 s: ten steps a window.
    flips = [(float(t), t % 2 == 0) for t in range(0, 30)]
    steps, t = [], 0.0
    for i in range(280):
        base = 0.1 * (1.0 + 0.001 * i)
        paused = window_state(flips, t + 1e-9)
        dt = base * (1.0 if paused else 1.05)
        t += dt
        steps.append((t, dt))
    ratios = running_over_paused(steps, flips)
    assert len(ratios) > 50
    assert abs(statistics.median(ratios) - 1.05) < 0.01


def test_skipped_steps_never_count():
    flips = [(0.0, True), (1.0, False)]
    steps = [(0.5, 0.4), (1.5, 0.4), (1.9, 0.3)]
    assert running_over_paused(steps, flips, skip=0) == [0.4 / 0.4, 0.3 / 0.4]
    assert running_over_paused(steps, flips, skip=1) == []  # the only paused step was skipped
