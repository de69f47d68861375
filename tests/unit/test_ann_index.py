"""Approximate index shards (faiss ivf and hnsw): recall against exact search, a query's
own nprobe / ef, exhaustive settings equal to exact search, and clear errors."""

from __future__ import annotations

import numpy as np
import pytest

from shoal.nodes.storage.index_shard import IndexShard
from shoal.topk import merge
from shoal.vector_index import IndexFileError, read_manifest, write_index


def lowrank(n: int, dim: int = 64, rank: int = 8, seed: int = 0) -> np.ndarray:
    """Vectors of low intrinsic dimension, as embeddings are (normalized)."""
    rng = np.random.default_rng(seed)
    basis = np.random.default_rng(99).standard_normal((rank, dim)).astype(np.float32)
    x = rng.standard_normal((n, rank)).astype(np.float32) @ basis + 0.1 * rng.standard_normal((n, dim)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


@pytest.fixture(scope="module")
def corpus():
    vectors = lowrank(8000)
    ids = [f"p{i:05d}" for i in range(len(vectors))]
    return ids, vectors, lowrank(200, seed=1)


def search_all(folder, queries, k, params=None):
    meta = read_manifest(folder)
    shards = [IndexShard(folder, s) for s in range(len(meta["shards"]))]
    per = [s.search(queries, k, params) for s in shards]
    return [merge([p[q] for p in per], k) for q in range(len(queries))], shards


def recall(got, want) -> float:
    return float(np.mean([len({h["id"] for h in g} & {h["id"] for h in w}) / len(w) for g, w in zip(got, want)]))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", ["ivf", "hnsw"])
def test_approximate_shards_find_what_exact_search_finds(corpus, tmp_path, kind):
    ids, vectors, queries = corpus
    write_index(tmp_path / "exact", ids, ids, vectors, "enc", shards=2)
    meta = write_index(tmp_path / kind, ids, ids, vectors, "enc", shards=2, kind=kind)
    assert meta["kind"] == kind and all("ann" in s for s in meta["shards"])
    exact, _ = search_all(tmp_path / "exact", queries, 10)
    approx, shards = search_all(tmp_path / kind, queries, 10)
    assert recall(approx, exact) >= 0.9
    for hits in approx:  # the order exact search uses: score, then id
        assert [(-h["score"], h["id"]) for h in hits] == sorted((-h["score"], h["id"]) for h in hits)
        assert all(h["text"] == h["id"] for h in hits)
    # Exhaustive settings, per query: the exact answer (scores within float32 rounding).
    name, full = ("nprobe", shards[0].ann["nlist"]) if kind == "ivf" else ("ef", len(ids))
    everything, _ = search_all(tmp_path / kind, queries, 10, [{name: full}] * len(queries))
    assert recall(everything, exact) == 1.0
    np.testing.assert_allclose([[h["score"] for h in q] for q in everything], [[h["score"] for h in q] for q in exact],
                               atol=1e-5)
    # Mixed settings in one call give what each gives alone.
    mixed = [{name: full} if i % 2 else {} for i in range(len(queries))]
    together, _ = search_all(tmp_path / kind, queries, 10, mixed)
    assert together[1::2] == everything[1::2] and together[::2] == approx[::2]


@pytest.mark.timeout(60)
def test_ann_errors_name_the_problem(corpus, tmp_path):
    ids, vectors, _ = corpus
    with pytest.raises(IndexFileError, match="nlist must be between 1 and the shard's 4000 rows"):
        write_index(tmp_path / "ix", ids, ids, vectors, "enc", shards=2, kind="ivf", ann={"nlist": 5000})
    with pytest.raises(IndexFileError, match="unknown index kind 'pq'"):
        write_index(tmp_path / "ix", ids, ids, vectors, "enc", kind="pq")
    write_index(tmp_path / "ok", ids[:100], ids[:100], vectors[:100], "enc", kind="hnsw", ann={"m": 8})
    (tmp_path / "ok" / "shard-00000.faiss").unlink()
    with pytest.raises(IndexFileError, match="shard 0 file shard-00000.faiss is missing"):
        IndexShard(tmp_path / "ok", 0)
