"""Building a vector index from an embedding job's complete output and the corpus copy
the storage node ingested (`shoal index build`): a tool that reads a storage node's
files, beside the index format itself (`vector_index.py`), which nodes and clients read."""

from __future__ import annotations

from pathlib import Path

import orjson

from shoal.vector_index import IndexFileError, ShardWriter


def _corpus_texts(embeddings: Path):
    """A reader of (id, text) rows of the embedded corpus: the copy the storage node
    ingested, which the embedding output points at."""
    from shoal.nodes.storage.corpus_store import Corpus

    pointer = embeddings / "corpus.json"
    if not pointer.exists():
        raise IndexFileError(f"{embeddings} does not say where its corpus is (no corpus.json): it was written by an "
                          "older Shoal; embed the corpus again into a fresh directory")
    folder = Path(orjson.loads(pointer.read_bytes())["dir"])
    if not (folder / "corpus.json").exists():
        raise IndexFileError(f"the corpus of {embeddings} ({folder}) is gone from storage")
    return Corpus(folder)


def build_index(embeddings: str | Path, out: str | Path, shards: int = 1, progress=None, kind: str = "exact",
                ann: dict | None = None) -> dict:
    """Writes an index of every vector in `embeddings` (an embedding job's output
    directory, complete) to `out` as `shards` shards; returns its manifest. `kind`:
    exact, ivf or hnsw (`ann`: the approximate kind's build options)."""
    from shoal.sdk.embeddings import EmbeddingSet

    embeddings, out = Path(embeddings), Path(out)
    es = EmbeddingSet(embeddings)
    missing = es.missing()
    if missing:
        raise IndexFileError(f"{embeddings} is not complete: {len(missing)} partitions lack "
                          f"{sum(missing.values())} rows (run the embedding job to its end first)")
    corpus = _corpus_texts(embeddings)
    w = ShardWriter(out, sum(es.partitions.values()), shards, es.header["encoder"], es.dim, kind, ann)
    for name in es.partitions:  # the corpus's partition order
        pid, matrix = es.matrix(name)
        rows = corpus.read(name, 0, len(pid))
        for i, ((cid, _), eid) in enumerate(zip(rows, pid)):
            if cid != eid:
                raise IndexFileError(f"partition {name!r} row {i}: the embeddings say {eid!r}, the corpus {cid!r}")
        w.add(pid, [t for _, t in rows], matrix)
        if progress:
            progress(w.done, w.meta["rows"])
    return w.finish()
