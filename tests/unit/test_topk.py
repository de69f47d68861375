"""Exact top-k and its merge across shards: the same hits as one brute-force search."""

import numpy as np

from shoal.topk import merge, top_k


def brute_force(scores, ids, k):
    return [sorted(range(len(ids)), key=lambda r: (-row[r], ids[r]))[:k] for row in scores]


def test_top_k_breaks_ties_by_id():
    scores = np.array([[0.5, 0.9, 0.5, 0.9, 0.1]], np.float32)
    ids = np.array(["e", "d", "c", "b", "a"], dtype=object)
    rows, best = top_k(scores, ids, 3)
    assert [ids[r] for r in rows[0]] == ["b", "d", "c"]
    assert best[0].tolist() == [np.float32(0.9), np.float32(0.9), np.float32(0.5)]


def test_shards_merged_equal_one_search_with_many_ties():
    rng = np.random.default_rng(0)
    n, d, q = 500, 8, 20
    vectors = rng.integers(-2, 3, size=(n, d)).astype(np.float32)  # small integers: many exact ties
    ids = np.array([f"p{i:04d}" for i in rng.permutation(n)], dtype=object)
    queries = rng.integers(-2, 3, size=(q, d)).astype(np.float32)
    scores = queries @ vectors.T
    for k in (1, 7, 40, n + 5):
        want = brute_force(scores, ids, k)
        for shards in (1, 3, 7):
            bounds = np.linspace(0, n, shards + 1).astype(int)
            per_shard = []
            for lo, hi in zip(bounds[:-1], bounds[1:]):
                rows, best = top_k(scores[:, lo:hi], ids[lo:hi], k)
                per_shard.append([[{"id": ids[lo + r], "score": float(s)} for r, s in zip(rr, ss)]
                                  for rr, ss in zip(rows, best)])
            got = [merge([shard[i] for shard in per_shard], k) for i in range(q)]
            assert [[h["id"] for h in g] for g in got] == [[ids[r] for r in w] for w in want], (k, shards)
