"""Exact top-k with one ordering everywhere: score descending, then passage id ascending.

The tie-break by id (not by row or shard) is what makes a search over N shards, merged,
return exactly what one search over the whole index returns: every shard orders its
candidates the same way the merge does.
"""

from __future__ import annotations

import numpy as np


def top_k(scores: np.ndarray, ids: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Rows of `scores` [queries, rows] -> (row indices [queries, k'], scores [queries, k'])
    with k' = min(k, rows), best first. `ids` [rows] holds the passage ids (str) that
    break ties."""
    scores = np.where(np.isnan(scores), -np.inf, scores)  # a NaN never outranks a number, nor breaks the partition
    q, n = scores.shape
    k = min(k, n)
    if k == 0:
        return np.zeros((q, 0), np.int64), np.zeros((q, 0), scores.dtype)
    out_rows = np.empty((q, k), np.int64)
    for i in range(q):
        row = scores[i]
        if k < n:
            # Candidates: everything scoring at least the k-th best, so rows tied with
            # it are all there for the tie-break to choose among.
            kth = np.partition(row, n - k)[n - k]
            cand = np.flatnonzero(row >= kth)
        else:
            cand = np.arange(n)
        order = np.lexsort((ids[cand], -row[cand]))[:k]
        out_rows[i] = cand[order]
    return out_rows, np.take_along_axis(scores, out_rows, axis=1)


def merge(per_shard: list[list[dict]], k: int) -> list[dict]:
    """One query's hits from several shards ({"id", "score", ...} each, best first)
    -> the global top-k under the same ordering."""
    hits = [h for shard in per_shard for h in shard]
    hits.sort(key=lambda h: (-h["score"], h["id"]))
    return hits[:k]
