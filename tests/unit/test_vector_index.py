"""The index on disk and an exact shard search, without a cluster."""

import numpy as np
import orjson
import pytest

from shoal.nodes.storage.index_shard import IndexShard
from shoal.topk import merge
from shoal.vector_index import IndexFileError, read_manifest, write_index


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
    with pytest.raises(IndexFileError, match="holds no index"):
        read_manifest(tmp_path)
    write_index(tmp_path / "ix", ["a", "b"], ["x", "y"], np.eye(2, dtype=np.float32), "enc", shards=2)
    (tmp_path / "ix" / "shard-00001.parquet").unlink()
    with pytest.raises(IndexFileError, match="shard 1 file shard-00001.parquet is missing"):
        IndexShard(tmp_path / "ix", 1)
    meta = orjson.loads((tmp_path / "ix" / "index.json").read_bytes())
    (tmp_path / "ix" / "index.json").write_bytes(orjson.dumps({**meta, "kind": "lsh"}))
    with pytest.raises(IndexFileError, match="index kind .lsh. is not supported"):
        read_manifest(tmp_path / "ix")
    with pytest.raises(IndexFileError, match="3 passages cannot fill 4 shards"):
        write_index(tmp_path / "iy", ["a", "b", "c"], ["x"] * 3, np.eye(3, dtype=np.float32), "enc", shards=4)


def test_nan_vectors_are_refused_and_nan_scores_rank_last(tmp_path):
    from shoal.topk import top_k

    bad = np.eye(3, dtype=np.float32)
    bad[1, 0] = np.nan
    with pytest.raises(IndexFileError, match="passage 'b' has a vector with NaN"):
        write_index(tmp_path / "ix", ["a", "b", "c"], ["x"] * 3, bad, "enc")
    rows, _ = top_k(np.array([[np.nan, 0.5, 0.1, np.nan]], np.float32), np.array(["a", "b", "c", "d"], dtype=object), 3)
    assert rows[0][:2].tolist() == [1, 2]


def test_a_storage_node_keeps_its_index_when_a_load_fails_and_sees_a_rebuild(tmp_path):
    from collections import Counter

    from shoal.nodes.storage.index_service import IndexService

    write_index(tmp_path / "ix", ["a", "b"], ["x", "y"], np.eye(2, dtype=np.float32), "enc", shards=2)
    service = IndexService(tmp_path / "node", Counter())
    service._load("default", str(tmp_path / "ix"), 0)
    before = service.published()["default"]
    broken = tmp_path / "broken"
    write_index(broken, ["a", "b"], ["x", "y"], np.eye(2, dtype=np.float32), "enc", shards=2)
    (broken / "shard-00000.safetensors").write_bytes(b"not safetensors")
    with pytest.raises(Exception):
        service._load("default", str(broken), 0)
    assert service.published()["default"] == before  # the failed load changed nothing
    # Rebuilt at the same path with other content: another id, so it replaces the old one.
    write_index(tmp_path / "ix", ["a", "b"], ["x", "z"], np.eye(2, dtype=np.float32)[::-1].copy(), "enc", shards=2)
    service._load("default", str(tmp_path / "ix"), 0)
    assert service.published()["default"]["index_id"] != before["index_id"]
    assert service.loaded["default"]["shards"][0].texts == ["x"] and service.loaded["default"]["shards"][0].vectors[0, 1] == 1


def test_workers_search_the_newest_complete_build_of_an_index():
    from shoal.nodes.membership import Member
    from shoal.nodes.worker.index_client import IndexClient, IndexUnavailable

    def member(node, iid, built, shards):
        return Member("storage", node, {"address": f"tcp://{node}", "indexes": {"default": {
            "index_id": iid, "encoder": "e", "dim": 4, "rows": 10, "shards_total": 2, "built_at": built, "shards": shards}}})

    client = IndexClient("unused:0", "c", None)
    members = {"s0": member("s0", "old", 1.0, [0, 1]), "s1": member("s1", "new", 2.0, [0]),
               "s2": member("s2", "new", 2.0, [1])}
    client._members = lambda: members
    info, replicas = client.locate("default")
    assert info["index_id"] == "new" and replicas == [[("s1", "tcp://s1")], [("s2", "tcp://s2")]]
    del members["s2"]  # the new build lacks a shard now: the old complete one serves
    assert client.locate("default")[0]["index_id"] == "old"
    del members["s0"]
    with pytest.raises(IndexUnavailable, match=r"version new lacks shards \[1\]"):
        client.locate("default")
    client.close()


def test_closing_the_index_client_ends_a_search_under_way():
    """A worker that stops while a search waits on a silent replica: close ends the search
    at once and waits for its shard threads (their sockets close with the node next)."""
    import socket
    import threading
    import time

    import numpy as np
    import zmq

    from shoal.nodes.worker.index_client import IndexClient, IndexUnavailable

    with socket.socket() as s:  # a loopback port nobody answers on
        s.bind(("127.0.0.1", 0))
        silent = f"tcp://127.0.0.1:{s.getsockname()[1]}"
    ctx = zmq.Context()
    client = IndexClient("unused:0", "c", ctx, timeout_s=60, attempt_s=60)
    client.locate = lambda name: ({"index_id": "i"}, [[("s0", silent)], [("s1", silent)]])
    failed = []

    def search():
        try:
            client.search("default", np.zeros((1, 4), np.float32), 3)
        except IndexUnavailable as e:
            failed.append(str(e))

    t = threading.Thread(target=search)
    t.start()
    time.sleep(0.5)  # both shard requests are waiting on the silent replica
    start = time.monotonic()
    client.close()
    t.join(timeout=10)
    assert not t.is_alive() and time.monotonic() - start < 3, "close did not end the search"
    assert failed and "stopping" in failed[0], failed
    ctx.destroy(linger=0)
