"""A vector index on disk, built from an embedding job's output (`shoal index build`).

    <dir>/index.json              {format, kind, encoder, dim, metric, rows, built_at,
                                   shards: [{file, rows, digest}]}
    <dir>/shard-NNNNN.safetensors "vectors": float32 [rows, dim]
    <dir>/shard-NNNNN.parquet     id (string), text (string): row i of the vectors

Rows go to shards in contiguous ranges of the corpus's partition order. Storage nodes
load shards (`nodes/index_shard.py`) and search them exactly; `kind` is the seam for
an approximate index (faiss, usearch) that a corpus too large for exact search would
use: a shard of another kind is refused by name until one is written.

Torch-free: the CLI, the SDK and storage nodes read it.
"""

from __future__ import annotations

import hashlib
import shutil
import time
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
    base = Path(folder).resolve()
    stem = base / meta["shards"][shard]["file"]
    files = stem.with_suffix(".safetensors").resolve(), stem.with_suffix(".parquet").resolve()
    # A manifest names files inside its own index folder, never elsewhere (links followed).
    if any(base not in f.parents for f in files):
        raise IndexError_(f"index {folder}: shard {shard} names a file outside the index folder")
    return files


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


class _ShardWriter:
    """Writes rows in order into `shards` shards of near-equal size, then the manifest."""

    def __init__(self, out: Path, total: int, shards: int, encoder: str, dim: int):
        if shards < 1:
            raise IndexError_(f"--shards must be at least 1, got {shards}")
        if total < shards:
            raise IndexError_(f"{total} passages cannot fill {shards} shards")
        self.out, self.tmp = out, out.with_name(out.name + ".building")
        shutil.rmtree(self.tmp, ignore_errors=True)
        self.tmp.mkdir(parents=True)
        self.bounds = np.linspace(0, total, shards + 1).round().astype(int)
        self.meta = {"format": FORMAT, "kind": "exact", "encoder": encoder, "dim": dim, "metric": "ip",
                     "rows": total, "built_at": time.time(), "shards": []}
        self.ids, self.texts, self.vecs, self.done = [], [], [], 0

    def add(self, ids: list, texts: list, matrix: np.ndarray) -> None:
        if not np.isfinite(matrix).all():
            bad = int(np.flatnonzero(~np.isfinite(matrix).all(axis=1))[0])
            raise IndexError_(f"passage {ids[bad]!r} has a vector with NaN or infinite values")
        pos = 0
        while pos < len(ids):
            shard = len(self.meta["shards"])
            take = min(len(ids) - pos, self.bounds[shard + 1] - self.done)
            self.ids += ids[pos:pos + take]
            self.texts += texts[pos:pos + take]
            self.vecs.append(matrix[pos:pos + take])
            pos, self.done = pos + take, self.done + take
            if self.done == self.bounds[shard + 1]:
                self._flush(shard)

    def _flush(self, shard: int) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq
        from safetensors.numpy import save_file

        name = f"shard-{shard:05d}"
        vectors = np.ascontiguousarray(np.concatenate(self.vecs).astype(np.float32))
        save_file({"vectors": vectors}, str(self.tmp / f"{name}.safetensors"))
        digest = hashlib.blake2b(vectors.tobytes(), digest_size=12)
        for i in self.ids:
            digest.update(i.encode() + b"\0")
        pq.write_table(pa.table({"id": pa.array(self.ids, pa.string()), "text": pa.array(self.texts, pa.string())}),
                       self.tmp / f"{name}.parquet")
        # The digest makes the manifest (and so the index's id) change with its content.
        self.meta["shards"].append({"file": name, "rows": len(self.ids), "digest": digest.hexdigest()})
        self.ids, self.texts, self.vecs = [], [], []

    def finish(self) -> dict:
        (self.tmp / "index.json").write_bytes(orjson.dumps(self.meta, option=orjson.OPT_INDENT_2))
        shutil.rmtree(self.out, ignore_errors=True)
        self.tmp.rename(self.out)
        return self.meta


def write_index(out: str | Path, ids: list[str], texts: list[str], vectors: np.ndarray, encoder: str,
                shards: int = 1) -> dict:
    """An index of rows held in memory (benchmarks, small corpora)."""
    w = _ShardWriter(Path(out), len(ids), shards, encoder, vectors.shape[1])
    w.add(list(ids), list(texts), vectors)
    return w.finish()


def build_index(embeddings: str | Path, out: str | Path, shards: int = 1, progress=None) -> dict:
    """Writes an exact index of every vector in `embeddings` (an embedding job's output
    directory, complete) to `out` as `shards` shards; returns its manifest."""
    from shoal.embeddings import EmbeddingSet

    embeddings, out = Path(embeddings), Path(out)
    es = EmbeddingSet(embeddings)
    missing = es.missing()
    if missing:
        raise IndexError_(f"{embeddings} is not complete: {len(missing)} partitions lack "
                          f"{sum(missing.values())} rows (run the embedding job to its end first)")
    corpus = _corpus_texts(embeddings)
    w = _ShardWriter(out, sum(es.partitions.values()), shards, es.header["encoder"], es.dim)
    for name in es.partitions:  # the corpus's partition order
        pid, matrix = es.matrix(name)
        rows = corpus.read(name, 0, len(pid))
        for i, ((cid, _), eid) in enumerate(zip(rows, pid)):
            if cid != eid:
                raise IndexError_(f"partition {name!r} row {i}: the embeddings say {eid!r}, the corpus {cid!r}")
        w.add(pid, [t for _, t in rows], matrix)
        if progress:
            progress(w.done, w.meta["rows"])
    return w.finish()
