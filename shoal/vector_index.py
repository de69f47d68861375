"""A vector index on disk, built from an embedding job's output (`shoal index build`).

    <dir>/index.json              {format, kind, encoder, encoder_name, dim, metric, rows,
                                   shards: [{file, rows}]}
    <dir>/shard-NNNNN.safetensors "vectors": float32 [rows, dim]
    <dir>/shard-NNNNN.parquet     id (string), text (string): row i of the vectors

Rows go to shards in contiguous ranges of the corpus's partition order. Storage nodes
load shards (`nodes/index_shard.py`) and search them exactly; `kind` is the seam for
an approximate index (faiss, usearch) that a corpus too large for exact search would
use: a shard of another kind is refused by name until one is written.

Torch-free: the CLI, the SDK and storage nodes read it.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import orjson

FORMAT = 1
KINDS = ("exact",)


class IndexError_(ValueError):
    """An index that cannot be built, read or used as asked; the message says why."""


def read_manifest(folder: str | Path) -> dict:
    path = Path(folder) / "index.json"
    if not path.exists():
        raise IndexError_(f"{folder} holds no index (no index.json): build one with `shoal index build`")
    meta = orjson.loads(path.read_bytes())
    if meta.get("format") != FORMAT:
        raise IndexError_(f"{path}: index format {meta.get('format')!r}, this Shoal reads format {FORMAT}")
    if meta.get("kind") not in KINDS:
        raise IndexError_(f"{path}: index kind {meta.get('kind')!r} is not supported (kinds: {', '.join(KINDS)})")
    return meta


def shard_files(folder: str | Path, meta: dict, shard: int) -> tuple[Path, Path]:
    if not 0 <= shard < len(meta["shards"]):
        raise IndexError_(f"index {folder} has {len(meta['shards'])} shards, not shard {shard}")
    stem = Path(folder) / meta["shards"][shard]["file"]
    return stem.with_suffix(".safetensors"), stem.with_suffix(".parquet")


def _corpus_texts(embeddings: Path):
    """A reader of (id, text) rows of the embedded corpus: the copy the storage node
    ingested, which the embedding output points at."""
    from shoal.nodes.corpus_store import Corpus

    pointer = embeddings / "corpus.json"
    if not pointer.exists():
        raise IndexError_(f"{embeddings} does not say where its corpus is (no corpus.json): it was written by an "
                          "older Shoal; embed the corpus again into a fresh directory")
    folder = Path(orjson.loads(pointer.read_bytes())["dir"])
    if not (folder / "corpus.json").exists():
        raise IndexError_(f"the corpus of {embeddings} ({folder}) is gone from storage")
    return Corpus(folder)


def build_index(embeddings: str | Path, out: str | Path, shards: int = 1, progress=None) -> dict:
    """Writes an exact index of every vector in `embeddings` (an embedding job's output
    directory, complete) to `out` as `shards` shards; returns its manifest."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from safetensors.numpy import save_file

    from shoal.embeddings import EmbeddingSet

    embeddings, out = Path(embeddings), Path(out)
    es = EmbeddingSet(embeddings)
    missing = es.missing()
    if missing:
        raise IndexError_(f"{embeddings} is not complete: {len(missing)} partitions lack "
                          f"{sum(missing.values())} rows (run the embedding job to its end first)")
    if shards < 1:
        raise IndexError_(f"--shards must be at least 1, got {shards}")
    corpus = _corpus_texts(embeddings)
    total = sum(es.partitions.values())
    if total < shards:
        raise IndexError_(f"{total} passages cannot fill {shards} shards")
    if out.exists():
        shutil.rmtree(out)
    tmp = out.with_name(out.name + ".building")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    bounds = np.linspace(0, total, shards + 1).round().astype(int)
    meta = {"format": FORMAT, "kind": "exact", "encoder": es.header["encoder"],
            "encoder_name": es.header.get("encoder_name", ""), "dim": es.dim, "metric": "ip", "rows": total,
            "shards": []}
    ids, texts, vecs, shard, done = [], [], [], 0, 0

    def flush():
        nonlocal ids, texts, vecs, shard
        name = f"shard-{shard:05d}"
        save_file({"vectors": np.ascontiguousarray(np.concatenate(vecs).astype(np.float32))},
                  str(tmp / f"{name}.safetensors"))
        pq.write_table(pa.table({"id": pa.array(ids, pa.string()), "text": pa.array(texts, pa.string())}),
                       tmp / f"{name}.parquet")
        meta["shards"].append({"file": name, "rows": len(ids)})
        ids, texts, vecs, shard = [], [], [], shard + 1

    for name in es.partitions:  # the corpus's partition order
        pid, matrix = es.matrix(name)
        rows = corpus.read(name, 0, len(pid))
        for i, ((cid, text), eid) in enumerate(zip(rows, pid)):
            if cid != eid:
                raise IndexError_(f"partition {name!r} row {i}: the embeddings say {eid!r}, the corpus {cid!r}")
        pos = 0
        while pos < len(pid):
            take = min(len(pid) - pos, bounds[shard + 1] - done)
            ids += pid[pos:pos + take]
            texts += [t for _, t in rows[pos:pos + take]]
            vecs.append(matrix[pos:pos + take])
            pos, done = pos + take, done + take
            if done == bounds[shard + 1]:
                flush()
        if progress:
            progress(done, total)
    (tmp / "index.json").write_bytes(orjson.dumps(meta, option=orjson.OPT_INDENT_2))
    tmp.rename(out)
    return meta
