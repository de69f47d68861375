"""Shared by the retrieval tests: a corpus of stdlib passages embedded by the cluster,
indexes built from it, and ircot items of varied shape."""

from __future__ import annotations

import orjson

from shoal.cli.demo_corpus import passages, questions


def embed_corpus(client, folder, minilm, count: int = 200):
    """Writes `count` demo passages, embeds them on the cluster; returns (corpus path, output dir)."""
    folder.mkdir(parents=True, exist_ok=True)
    corpus = passages(count)
    path = folder / "corpus.jsonl"
    path.write_bytes(b"".join(orjson.dumps(p) + b"\n" for p in corpus))
    out = folder / "emb"
    state = client.embed([str(path)], str(out), str(minilm), b_min=64, n_max=64).wait_until_done(poll=0.2)
    assert state["state"] == "done", state
    return corpus, out


def rag_items(corpus, n: int = 6) -> list[dict]:
    """Questions with hop counts 1-4 and per-hop thought lengths that vary."""
    return [{**q, "max_hops": 1 + i % 4, "thought_tokens": [4 + (3 * i + 2 * h) % 9 for h in range(4)]}
            for i, q in enumerate(questions(corpus, n))]
