"""Work stealing and draining: which sequences move from which worker to which.

Pure functions of the scheduler's view (sequences each worker holds, how many it can
hold), so they are tested without processes. The scheduler turns a `Move` into a
MigrateSequences command; the source worker picks which sequences go (queued ones
first, then those with the least progress), since only it knows their state.

Stealing only starts when nothing is waiting to be placed: while a job still has
pending items, an idle worker simply gets those. It moves half the gap between the
most and the least loaded worker, so two workers never trade the same sequences back
and forth, and never more than the target can hold.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Move:
    source: str
    target: str
    count: int  # -1: everything the source holds


def plan_steals(held: dict[str, int], capacity: dict[str, int], pending: int, busy: set[str] = frozenset(),
                min_gap: int = 4) -> list[Move]:
    """Moves from the most to the least loaded workers. `busy`: workers with a move
    under way (neither side of a new one until it is reported)."""
    if pending > 0:
        return []
    free = {w: n for w, n in held.items() if w not in busy}
    moves = []
    while len(free) >= 2:
        src = max(free, key=lambda w: (free[w], w))
        dst = min(free, key=lambda w: (free[w], w))
        gap = free[src] - free[dst]
        if gap < min_gap:
            break
        count = min(gap // 2, capacity.get(dst, 0) - free[dst])
        if count <= 0:
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
