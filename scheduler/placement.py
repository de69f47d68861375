"""Admission and placement: which worker runs which pending sequence. Pure.

Each worker reports its free KV tokens, how many sequences it holds and its queue bound;
its speed comes from its published calibration (1/β_d: decode tokens per second per
sequence-step). A sequence goes to the worker that would finish its queue soonest
counting it — (held + 1) / speed —, never past a worker's queue bound or its free KV
(a sequence's KV need is its prompt plus its max_tokens, but never more than the
longest sequence the worker runs: its engine stops a sequence there, so a max_tokens
past the context must not keep it pending forever). What fits nowhere stays pending
for the next round, in order.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass


@dataclass(frozen=True)
class WorkerLoad:
    node_id: str
    free_kv_tokens: int
    held: int  # sequences assigned and not yet finished
    max_held: int
    speed: float = 1.0  # relative throughput (from the calibration); >0
    max_seq_tokens: int | None = None  # the longest sequence it runs (None: its whole KV)


@dataclass(frozen=True)
class PendingSeq:
    seq_id: object
    kv_tokens: int  # prompt + max_tokens


def place(pending: list[PendingSeq], workers: list[WorkerLoad]) -> tuple[dict[str, list], list]:
    """Returns ({node_id: [seq_id, ...]}, still pending). Workers wait in a heap by the
    time they would need for their queue plus one more (ties: more free KV, then id),
    so placing P sequences over W workers costs O(P log W) unless KV is short."""
    by_id = {w.node_id: w for w in workers}
    held = {w.node_id: w.held for w in workers}
    free = {w.node_id: w.free_kv_tokens for w in workers}
    out: dict[str, list] = {w.node_id: [] for w in workers}
    left = []

    def key(w: WorkerLoad) -> tuple:
        return (held[w.node_id] + 1) / max(w.speed, 1e-9), -free[w.node_id], w.node_id

    def need(seq: PendingSeq, w: WorkerLoad) -> int:
        return min(seq.kv_tokens, w.max_seq_tokens or w.free_kv_tokens)

    heap = [key(w) for w in workers if held[w.node_id] < w.max_held]
    heapq.heapify(heap)
    for seq in pending:
        skipped = []
        while heap:
            entry = heapq.heappop(heap)
            if free[entry[2]] >= need(seq, by_id[entry[2]]):
                break
            skipped.append(entry)  # too little KV for this one; it may fit the next
        else:
            entry = None
        for e in skipped:
            heapq.heappush(heap, e)
        if entry is None:
            left.append(seq)
            continue
        w = by_id[entry[2]]
        out[w.node_id].append(seq.seq_id)
        held[w.node_id] += 1
        free[w.node_id] -= need(seq, w)
        if held[w.node_id] < w.max_held:
            heapq.heappush(heap, key(w))
    return {k: v for k, v in out.items() if v}, left
