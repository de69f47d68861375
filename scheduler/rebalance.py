"""Work stealing and draining: which sequences move from which worker to which.

Pure functions of the scheduler's view (sequences each worker holds, how many it can
hold), so they are tested without processes. The scheduler turns a `Move` into a
MigrateSequences command; the source worker picks which sequences go (queued ones
first, then those with the least progress), since only it knows their state.

Stealing only starts when nothing is waiting to be placed: while a job still has
pending items, an idle worker simply gets those. A worker's load is the time it needs
for what it holds, held / speed (sequence-steps per second from its calibration; equal
speeds make it the count). A move goes from the worker with the most time left to the
one with the least, the count that leaves both with the same time (half the gap when
speeds are equal), so two workers never trade the same sequences back and forth, and
never more than the target can hold. Counting sequences alone sent work from fast
cards to slow ones (a fast card holds more): simulated with half H200 and half RTX PRO
6000 cards, stealing by count made a job slower than no stealing at all.
"""

from __future__ import annotations

from dataclasses import dataclass

from shoal.scheduler.worker_info import filled_speeds


@dataclass(frozen=True)
class Move:
    source: str
    target: str
    count: int  # -1: everything the source holds


def plan_steals(held: dict[str, int], capacity: dict[str, int], pending: int, busy: set[str] = frozenset(),
                min_gap: int = 4, speed: dict[str, float] | None = None) -> list[Move]:
    """Moves from the workers with the most time left to those with the least. `busy`:
    workers with a move under way (neither side of a new one until it is reported).
    `speed`: each worker's sequence-steps per second (a worker without one counts as
    the mean of the others). A move needs a gap of min_gap between equal workers, or
    the time-equivalent of it between unequal ones."""
    if pending > 0:
        return []
    free = {w: n for w, n in held.items() if w not in busy}
    v = filled_speeds({w: (speed or {}).get(w) for w in held})
    moves = []
    while len(free) >= 2:
        src = max(free, key=lambda w: (free[w] / v[w], free[w], w))
        dst = min(free, key=lambda w: (free[w] / v[w], free[w], w))
        # (h_s - c) / v_s = (h_d + c) / v_d: both then finish together.
        even = (free[src] * v[dst] - free[dst] * v[src]) / (v[src] + v[dst])
        count = min(int(even + 1e-9), capacity.get(dst, 0) - free[dst])
        if 2 * even + 1e-9 < min_gap or count <= 0:
            break
        moves.append(Move(src, dst, count))
        del free[src], free[dst]
    return moves


def plan_drain(draining: str, held: dict[str, int], capacity: dict[str, int], holding: int,
               exclude: set[str] = frozenset()) -> list[Move]:
    """Spreads the `holding` sequences of a draining worker over the others by free
    room (the least loaded first). Returns nothing if no other worker can take any."""
    room = {w: capacity.get(w, 0) - n for w, n in held.items() if w != draining and w not in exclude}
    room = {w: r for w, r in room.items() if r > 0}
    moves, left = [], holding
    for w in sorted(room, key=lambda w: (-room[w], w)):
        if left <= 0:
            break
        n = min(room[w], left)
        moves.append(Move(draining, w, n))
        left -= n
    return moves
