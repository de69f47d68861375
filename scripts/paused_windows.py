"""What the other processes on a host cost a worker's steps, measured inside one job.

This machine's speed drifts by 10-30% between minutes, more than the cost being
measured, so two runs minutes apart (in-process, then through the cluster) cannot say
whether the other nodes cost 3% or 15%. Instead, during one cluster job, the benchmark
pauses every other process (SIGSTOP) and resumes it (SIGCONT) in turns of a second or
two, and the worker logs each step's end time and length (`--step-log`). A step that
ran while the others ran is compared with its neighbours that ran while they were
paused: the same phase of the same job, seconds apart.
"""

from __future__ import annotations

import bisect
import statistics


def window_state(flips: list[tuple[float, bool]], t: float) -> bool | None:
    """Whether the others were paused at time `t`, given the (time, paused) flips in time
    order; None before the first flip."""
    i = bisect.bisect_right([f[0] for f in flips], t)
    return flips[i - 1][1] if i else None


def step_states(steps: list[tuple[float, float]], flips: list[tuple[float, bool]]) -> list[bool | None]:
    """For each (end time, seconds) step: True if it ran wholly while the others were
    paused, False if wholly while they ran, None if a flip fell inside it (or before the
    first flip)."""
    out: list[bool | None] = []
    times = [f[0] for f in flips]
    for end, dt in steps:
        a, b = bisect.bisect_right(times, end - dt), bisect.bisect_right(times, end)
        out.append(flips[a - 1][1] if a == b and a else None)
    return out


def running_over_paused(steps: list[tuple[float, float]], flips: list[tuple[float, bool]],
                        skip: int = 0, reach: int = 4) -> list[float]:
    """Each step that ran beside the others, over the mean of the paused steps within
    `reach` steps of it (steps change length as a job goes on: only neighbours compare).
    `skip`: leave out the first steps (a job's long prefill steps straddle every flip)."""
    states = step_states(steps, flips)
    ratios = []
    for i, ((_, dt), state) in enumerate(zip(steps, states)):
        if i < skip or state is not False:
            continue
        near = [steps[j][1] for j in range(max(skip, i - reach), min(len(steps), i + reach + 1)) if states[j] is True]
        if near:
            ratios.append(dt / statistics.mean(near))
    return ratios
