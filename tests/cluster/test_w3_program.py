"""The built-in `w3` program (the benchmark job) through a real cluster: token prompts
built with Tokenize, retrieval from an index the cluster embedded, exactly the work
its items ask for."""

from __future__ import annotations

import orjson
import pytest

import shoal
from shoal.examples.w3_data import passages, questions, workload
from shoal.transport.rpc import RemoteError
from shoal.cli.index_build import build_index


@pytest.fixture(scope="module")
def w3_model(tmp_path_factory, minilm):
    """The tiny shape with MiniLM's WordPiece tokenizer, as W3's decoder has."""
    from shoal.nodes.worker.models.make_model import make_model

    return make_model(tmp_path_factory.mktemp("w3-model"), preset="tiny", dtype="float32", tokenizer=minilm)


def test_w3_items_run_through_a_cluster_with_exactly_their_work(w3_model, minilm, tmp_path, etcd_endpoint):
    corpus = passages(300)
    items = questions(corpus, 5)
    want = workload(items)
    path = tmp_path / "passages.jsonl"
    path.write_bytes(b"".join(orjson.dumps(p) + b"\n" for p in corpus))
    with shoal.LocalCluster(w3_model, encoder=minilm, state_dir=tmp_path / "c", policy="mb") as c:
        client = shoal.Client(c.router)
        state = client.embed([str(path)], str(tmp_path / "emb"), str(minilm), b_min=64, n_max=64).wait_until_done(poll=0.2)
        assert state["state"] == "done", state
        build_index(tmp_path / "emb", tmp_path / "index", 1)
        client.load_index(tmp_path / "index", "default")
        job = client.submit(items, program="w3")
        recs = {r["id"]: r for r in job.wait(timeout=240)}
        status = job.status()
        # A w3 item without its hop lengths is refused when submitted, naming the field.
        with pytest.raises(RemoteError, match="thought_tokens must list"):
            client.submit([{"id": "x", "question": "why?", "max_hops": 2, "thought_tokens": [3], "final_tokens": 4}],
                          program="w3")
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(w3_model / "tokenizer.json"))
    assert tok.truncation is None  # the model folder took MiniLM's tokenizer without its 128-token limit
    texts = {p["id"]: p["text"] for p in corpus}
    for it in items:
        rec = recs[it["id"]]
        assert "error" not in rec, rec
        assert rec["retrievals"] == it["max_hops"] == len(rec["hops"])
        assert rec["generated_tokens"] == sum(it["thought_tokens"][:it["max_hops"]]) + it["final_tokens"]
        # The context is the retrieved passages' tokens, in rank order, repeats kept.
        ctx = sum((len(tok.encode(texts[p], add_special_tokens=False).ids) for h in rec["hops"] for p in h["passages"]), 0)
        assert rec["context_tokens"] == ctx and all(len(h["passages"]) == 4 for h in rec["hops"])
    assert sum(r["generated_tokens"] for r in recs.values()) == want["generated_tokens"]
    assert sum(r["retrievals"] for r in recs.values()) == want["retrievals"]
    assert (status["state"], status["done"], status["failed"]) == ("done", len(items), 0), status
