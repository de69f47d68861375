"""Iterative retrieval on a real cluster: index shards on two storage nodes, Retrieve
batched by the workers, the ircot program, and its bad inputs."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import orjson
import pytest

import shoal
from shoal.sdk.embeddings import EmbeddingSet
from shoal.output_compare import compare_rag
from shoal.program import Embed, Retrieve
from shoal.transport.rpc import RemoteError
from shoal.cli.index_build import build_index

from killed_command import kill_when
from rag_setup import embed_corpus, rag_items

TESTS = str(Path(__file__).resolve().parent)


def query_both_ways(item, k=5, index="default"):
    """A query by text (the worker embeds it) and by the vector the worker's encoder gives it."""
    vec = yield Embed(texts=[item["q"]])
    by_text = yield Retrieve(query=item["q"], k=k, index=index)
    by_vector = yield Retrieve(query=vec[0], k=k, index=index)
    return {"vector": vec[0], "by_text": by_text, "by_vector": by_vector}


def query_ann(item, k=5, index="default", nprobe=None):
    """A query at the index's default setting and at the one this item asks for."""
    vec = yield Embed(texts=[item["q"]])
    default = yield Retrieve(query=vec[0], k=k, index=index)
    own = yield Retrieve(query=vec[0], k=k, index=index, nprobe=nprobe)
    return {"vector": vec[0], "default": default, "own": own}


def corpus_matrix(emb) -> tuple[list, np.ndarray]:
    """Every passage id and its vector (float64), in the embedding output's order."""
    es = EmbeddingSet(emb)
    ids, matrix = [], []
    for name in es.partitions:
        i, m = es.matrix(name)
        ids += i
        matrix.append(m)
    return ids, np.concatenate(matrix).astype(np.float64)


@pytest.fixture(scope="module")
def rag_cluster(tiny_model, minilm, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("rag")
    env = {"PYTHONPATH": os.pathsep.join([TESTS, str(Path(TESTS).parent), os.environ.get("PYTHONPATH", "")])}
    with shoal.LocalCluster(tiny_model, encoder=minilm, workers=2, storage_nodes=2, state_dir=tmp / "c", policy="mb",
                            env=env, worker_args=["--retrieve-timeout", "5"]) as c:
        client = shoal.Client(c.router)
        corpus, emb = embed_corpus(client, tmp / "data", minilm)
        for shards in (1, 3):
            build_index(emb, tmp / f"index{shards}", shards)
        yield c, client, corpus, emb, tmp


def test_retrieval_equals_brute_force_for_one_and_three_shards(rag_cluster):
    c, client, corpus, emb, tmp = rag_cluster
    one = client.load_index(tmp / "index1", "one")
    three = client.load_index(tmp / "index3", "three", replicas=2)
    assert len(one["placement"]) == 1 and [len(n) for n in three["placement"]] == [2, 2, 2]
    ids, matrix = corpus_matrix(emb)
    qs = [{"id": f"q{i}", "q": p["text"][:60]} for i, p in enumerate(corpus[::20])]
    for index in ("one", "three"):
        recs = client.submit(qs, program="test_retrieval:query_both_ways", params={"k": 5, "index": index}).wait(timeout=120)
        assert len(recs) == len(qs)
        for rec in recs:
            assert "error" not in rec, rec
            scores = matrix @ np.asarray(rec["vector"], np.float64)
            want = sorted(range(len(ids)), key=lambda r: (-scores[r], ids[r]))[:5]
            for hits in (rec["by_vector"], rec["by_text"]):
                assert len(hits) == 5
                np.testing.assert_allclose([h["score"] for h in hits], scores[want], atol=1e-5)
                for h, r in zip(hits, want):  # ids equal, except among scores tied within the tolerance
                    assert h["id"] == ids[r] or abs(scores[ids.index(h["id"])] - scores[r]) < 1e-5
                    assert h["text"] == next(p["text"] for p in corpus if p["id"] == h["id"])


def test_approximate_index_with_a_query_s_own_nprobe(rag_cluster):
    """An ivf index in 3 shards on the storage nodes: each query's default search gives
    k hits in order; its own nprobe covering every list gives exactly brute force."""
    c, client, corpus, emb, tmp = rag_cluster
    meta = build_index(emb, tmp / "ivf", 3, kind="ivf")
    client.load_index(tmp / "ivf", "ivf")
    ids, matrix = corpus_matrix(emb)
    nlist = max(s["ann"]["nlist"] for s in meta["shards"])
    qs = [{"id": f"q{i}", "q": p["text"][:60]} for i, p in enumerate(corpus[::25])]
    recs = client.submit(qs, program="test_retrieval:query_ann", params={"k": 5, "index": "ivf", "nprobe": nlist}
                         ).wait(timeout=120)
    assert len(recs) == len(qs)
    for rec in recs:
        assert "error" not in rec, rec
        scores = matrix @ np.asarray(rec["vector"], np.float64)
        want = sorted(range(len(ids)), key=lambda r: (-scores[r], ids[r]))[:5]
        np.testing.assert_allclose([h["score"] for h in rec["own"]], scores[want], atol=1e-5)
        assert [h["id"] for h in rec["own"]] == [ids[r] for r in want]
        assert len(rec["default"]) == 5 and all(h["id"] in ids for h in rec["default"])
        assert [h["score"] for h in rec["default"]] == sorted((h["score"] for h in rec["default"]), reverse=True)


def test_rag_equals_each_question_run_alone(rag_cluster):
    c, client, corpus, emb, tmp = rag_cluster
    client.load_index(tmp / "index3", "default", replicas=1)
    work = rag_items(corpus, 6)
    params = {"k": 3, "trace": True}
    together = {r["id"]: r for r in client.submit(work, program="ircot", params=params).wait(timeout=240)}
    for it in work:
        alone = client.submit([it], program="ircot", params=params).wait(timeout=120)[0]
        got = together[it["id"]]
        assert "error" not in got and "error" not in alone, (got, alone)
        assert len(got["hops"]) == it["max_hops"]  # a random model never writes the answer marker
        assert got["hops"][0]["query"] == it["question"] and len(got["hops"][0]["passages"]) == 3
        cmp = compare_rag(got, alone)
        assert cmp, f"{it['id']}: {cmp.detail}"


def test_bad_rag_input_gets_clear_errors(rag_cluster, tiny_encoder):
    c, client, corpus, emb, tmp = rag_cluster
    client.load_index(tmp / "index1", "one")
    work = rag_items(corpus, 2)
    # k larger than the index: each sequence says so.
    recs = client.submit(work, program="ircot", params={"k": 500, "index": "one"}).wait(timeout=120)
    assert all("k=500 is larger than index 'one' (200 passages)" in r["error"] for r in recs), recs
    # An index whose manifest names another encoder: refused when its queries are embedded.
    other = tmp / "index-other"
    shutil.copytree(tmp / "index1", other)
    meta = orjson.loads((other / "index.json").read_bytes())
    (other / "index.json").write_bytes(orjson.dumps({**meta, "encoder": "0123456789abcdef"}))
    client.load_index(other, "other")
    recs = client.submit(work, program="ircot", params={"index": "other"}).wait(timeout=120)
    assert all("index 'other' was built with encoder 0123456789abcdef" in r["error"] for r in recs), recs
    # An index nobody loaded: a clear error after the retrieve timeout, nothing hangs.
    recs = client.submit(work[:1], program="ircot", params={"index": "nowhere"}).wait(timeout=120)
    assert "no storage node holds index 'nowhere'" in recs[0]["error"]
    # Questions that are not questions: the job is refused, naming the line.
    with pytest.raises(RemoteError, match="needs a non-empty \"question\""):
        client.submit([{"id": "x", "prompt": "no question"}], program="ircot")
    # The CLI's checks before anything starts: wrong encoder, k too large, a broken line.
    from shoal.generate_input import InputError
    from shoal.cli.rag import check_index, read_questions
    from shoal.vector_index import IndexFileError

    with pytest.raises(IndexFileError, match="queries must be embedded by the encoder that embedded the passages"):
        check_index(tmp / "index1", tiny_encoder, 3)
    with pytest.raises(IndexFileError, match="--k 201 is larger than index"):
        check_index(tmp / "index1", c.encoder, 201)
    bad = tmp / "bad.jsonl"
    bad.write_text('{"id": "a", "question": "fine?"}\n{"id": "b", "question": \n')
    with pytest.raises(InputError, match=r"bad.jsonl:2"):
        read_questions(bad)
    # Bad searches at storage's search socket: each gets an error naming it, and the
    # node goes on answering.
    info = {m["node_id"]: m["info"] for m in client.cluster_info()}
    holder = next(n for n, i in info.items() if "one" in i.get("indexes", {}))
    search = shoal.transport.rpc.RpcClient(info[holder]["search_address"])
    shard = info[holder]["indexes"]["one"]["shards"][0]
    with pytest.raises(RemoteError, match="storage holds no shard 7 of index 'one'"):
        search.request("SearchIndex", {"name": "one", "index_id": "", "shard": 7, "k": 1, "count": 1},
                       {"queries": np.zeros(384, np.float32).tobytes()})
    with pytest.raises(RemoteError, match="queries blob of 12 bytes is not 1 float32 vectors of dimension 384"):
        search.request("SearchIndex", {"name": "one", "index_id": "", "shard": shard, "k": 1, "count": 1},
                       {"queries": b"\0" * 12})
    with pytest.raises(RemoteError, match="the search socket answers SearchIndex only"):
        search.request("StatsQuery", {})
    ok = search.request("SearchIndex", {"name": "one", "index_id": "", "shard": shard, "k": 2, "count": 1},
                        {"queries": np.ones(384, np.float32).tobytes()})
    assert len(ok["hits"][0]) == 2


def bad_vector(item):
    hits = yield Retrieve(query=[1.0, "x"], k=2)
    return {"hits": hits}


def test_a_malformed_query_fails_only_its_sequence(rag_cluster):
    c, client, corpus, emb, tmp = rag_cluster
    client.load_index(tmp / "index1", "default")
    recs = {r["id"]: r for r in client.submit([{"id": "bad"}], program="test_retrieval:bad_vector").wait(timeout=60)}
    assert "a Retrieve query must be a text or a vector of finite numbers" in recs["bad"]["error"]
    ok = client.submit(rag_items(corpus, 1), program="ircot", params={"k": 2}).wait(timeout=60)
    assert "error" not in ok[0] and len(ok[0]["hops"][0]["passages"]) == 2


def test_a_killed_rag_is_finished_by_the_same_command(rag_cluster):
    """`shoal rag` streams answers into OUT.part and a rerun keeps them: an interrupted
    run (killed once it had marked its output unfinished, then given three answers as a
    crash would leave them) is finished by the same command, which runs only the other
    questions and writes every answer once, in input order."""
    c, client, corpus, emb, tmp = rag_cluster
    items = rag_items(corpus, 8)
    inp = tmp / "resume-questions.jsonl"
    inp.write_bytes(b"".join(orjson.dumps(it) + b"\n" for it in items))

    def rag(out):
        return [sys.executable, "-m", "shoal.cli", "rag", "--router", c.router, "--encoder", str(c.encoder),
                "--index", str(tmp / "index1"), "--index-name", "resume", "--input", str(inp), "--output", str(out),
                "--k", "3"]

    # The reference run takes a job key of its own: under the default key (the run's
    # fingerprint, which the output path is not part of) the run killed below would
    # reattach to this finished job and could end before it is killed.
    whole = subprocess.run(rag(tmp / "whole.jsonl") + ["--job-key", "rag-resume-reference"], capture_output=True,
                           text=True, timeout=300)
    assert whole.returncode == 0, whole.stderr[-2000:]
    reference = (tmp / "whole.jsonl").read_bytes().splitlines(keepends=True)
    out = tmp / "resumed.jsonl"
    part, marker = tmp / "resumed.jsonl.part", tmp / "resumed.jsonl.part.unfinished"
    kill_when(rag(out), marker.exists)
    with open(part, "ab") as fh:  # what the killed run had written
        fh.write(b"".join(reference[i] for i in (5, 0, 2)))
    again = subprocess.run(rag(out), capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr[-2000:]
    assert "resuming: 3 of 8 answers already in" in again.stderr and ": 5 questions via" in again.stderr
    assert not part.exists() and not marker.exists()
    lines = out.read_bytes().splitlines(keepends=True)
    assert [orjson.loads(x)["id"] for x in lines] == [it["id"] for it in items]
    assert [lines[i] for i in (0, 2, 5)] == [reference[i] for i in (0, 2, 5)]  # kept as they were
    for it, line in zip(items, lines):  # the five run again: whole answers (equality with a run
        rec = orjson.loads(line)        # alone is test_rag_equals_each_question_run_alone's)
        assert "error" not in rec and len(rec["hops"]) == it["max_hops"], rec
        assert rec["hops"][0]["query"] == it["question"] and all(len(h["passages"]) == 3 for h in rec["hops"])
