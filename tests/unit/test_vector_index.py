"""The index on disk and an exact shard search, without a cluster."""

import numpy as np
import orjson
import pytest

from shoal.nodes.index_shard import IndexShard
from shoal.topk import merge
from shoal.vector_index import IndexError_, read_manifest, write_index


def test_shards_searched_and_merged_equal_brute_force(tmp_path):
    rng = np.random.default_rng(1)
    vectors = rng.standard_normal((101, 16)).astype(np.float32)
    ids = [f"doc-{i}" for i in range(101)]
    meta = write_index(tmp_path / "ix", ids, [f"text {i}" for i in ids], vectors, "enc-1", shards=4)
    assert [s["rows"] for s in meta["shards"]] == [25, 25, 26, 25] and read_manifest(tmp_path / "ix") == meta
    shards = [IndexShard(tmp_path / "ix", s) for s in range(4)]
    queries = rng.standard_normal((9, 16)).astype(np.float32)
    scores = queries.astype(np.float64) @ vectors.T.astype(np.float64)
    per_shard = [s.search(queries, 7) for s in shards]
    for q in range(9):
        got = merge([hits[q] for hits in per_shard], 7)
        want = np.argsort(-scores[q], kind="stable")[:7]
        assert [h["id"] for h in got] == [ids[r] for r in want]
        np.testing.assert_allclose([h["score"] for h in got], scores[q][want], rtol=1e-6)
        assert got[0]["text"] == f"text {ids[want[0]]}"
    # A query scores the same alone as in a batch.
    alone = shards[0].search(queries[3:4], 7)[0]
    assert alone == per_shard[0][3]


def test_broken_indexes_are_refused_by_name(tmp_path):
    with pytest.raises(IndexError_, match="holds no index"):
        read_manifest(tmp_path)
    write_index(tmp_path / "ix", ["a", "b"], ["x", "y"], np.eye(2, dtype=np.float32), "enc", shards=2)
    (tmp_path / "ix" / "shard-00001.parquet").unlink()
    with pytest.raises(IndexError_, match="shard 1 file shard-00001.parquet is missing"):
        IndexShard(tmp_path / "ix", 1)
    meta = orjson.loads((tmp_path / "ix" / "index.json").read_bytes())
    (tmp_path / "ix" / "index.json").write_bytes(orjson.dumps({**meta, "kind": "hnsw"}))
    with pytest.raises(IndexError_, match="index kind 'hnsw' is not supported"):
        read_manifest(tmp_path / "ix")
    with pytest.raises(IndexError_, match="3 passages cannot fill 4 shards"):
        write_index(tmp_path / "iy", ["a", "b", "c"], ["x"] * 3, np.eye(3, dtype=np.float32), "enc", shards=4)
