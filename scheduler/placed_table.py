"""Which worker holds each of a job's sequences, with a running count per worker.

The rebalancer reads every worker's load on every tick; counting it from the table
each time cost O(sequences placed) — 65k at 128 workers, most of a busy scheduler's
time. The counts change with the table instead.
"""

from __future__ import annotations

from collections import Counter


class PlacedTable(dict):
    """seq_id -> worker id; `per_worker` counts the sequences each worker holds."""

    def __init__(self, pairs=()):
        super().__init__()
        self.per_worker: Counter = Counter()
        self.update(pairs)

    def __setitem__(self, sid, wid) -> None:
        old = dict.get(self, sid)
        if old is not None:
            self._less(old)
        dict.__setitem__(self, sid, wid)
        self.per_worker[wid] += 1

    def __delitem__(self, sid) -> None:
        self._less(dict.pop(self, sid))

    def pop(self, sid, *default):
        if sid in self:
            wid = dict.pop(self, sid)
            self._less(wid)
            return wid
        if default:
            return default[0]
        raise KeyError(sid)

    def popitem(self):
        sid, wid = dict.popitem(self)
        self._less(wid)
        return sid, wid

    def setdefault(self, sid, wid=None):
        if sid not in self:
            self[sid] = wid
        return dict.__getitem__(self, sid)

    def update(self, pairs=()) -> None:
        for sid, wid in (pairs.items() if isinstance(pairs, dict) else pairs):
            self[sid] = wid

    def clear(self) -> None:
        dict.clear(self)
        self.per_worker.clear()

    def _less(self, wid) -> None:
        n = self.per_worker[wid] - 1
        if n > 0:
            self.per_worker[wid] = n
        else:
            del self.per_worker[wid]
