"""A vector index on disk, built from an embedding job's output (`shoal index build`,
`index_build.py`).

    <dir>/index.json              {format, kind, encoder, dim, metric, rows, built_at,
                                   shards: [{file, rows, digest, [ann]}]}
    <dir>/shard-NNNNN.safetensors "vectors": float32 [rows, dim]
    <dir>/shard-NNNNN.parquet     id (string), text (string): row i of the vectors
    <dir>/shard-NNNNN.faiss       kinds ivf and hnsw: the shard's faiss index (`ann_index.py`)

Rows go to shards in contiguous ranges of the corpus's partition order. Storage nodes
load shards (`nodes/storage/index_shard.py`) and search them: exactly (kind `exact`), or through
the faiss index (kinds `ivf`, `hnsw`, whose build parameters and search defaults are
the shard's `ann`). The vectors file stays beside a faiss index: it is what the index
was built from, and a later build of another kind reads it.

Torch-free: the CLI, the SDK and storage nodes read it.
"""

from __future__ import annotations

import hashlib
import shutil
import time
from pathlib import Path

import numpy as np
import orjson

from shoal.protocol.errors import ShoalError

FORMAT = 1
KINDS = ("exact", "ivf", "hnsw")


class IndexFileError(ShoalError, ValueError):
    """An index that cannot be built, read or used as asked; the message says why."""


def read_manifest(folder: str | Path) -> dict:
    path = Path(folder) / "index.json"
    if not path.exists():
        raise IndexFileError(f"{folder} holds no index (no index.json): build one with `shoal index build`")
    meta = orjson.loads(path.read_bytes())
    if meta.get("format") != FORMAT:
        raise IndexFileError(f"{path}: index format {meta.get('format')!r}, this Shoal reads format {FORMAT}")
    if meta.get("kind") not in KINDS:
        raise IndexFileError(f"{path}: index kind {meta.get('kind')!r} is not supported (kinds: {', '.join(KINDS)})")
    return meta


def shard_files(folder: str | Path, meta: dict, shard: int) -> tuple[Path, Path, Path]:
    """The shard's vectors, texts and faiss index files (the last exists for kinds ivf and hnsw)."""
    if not 0 <= shard < len(meta["shards"]):
        raise IndexFileError(f"index {folder} has {len(meta['shards'])} shards, not shard {shard}")
    base = Path(folder).resolve()
    stem = base / meta["shards"][shard]["file"]
    files = tuple(stem.with_suffix(ext).resolve() for ext in (".safetensors", ".parquet", ".faiss"))
    # A manifest names files inside its own index folder, never elsewhere (links followed).
    if any(base not in f.parents for f in files):
        raise IndexFileError(f"index {folder}: shard {shard} names a file outside the index folder")
    return files


class ShardWriter:
    """Writes rows in order into `shards` shards of near-equal size, then the manifest."""

    def __init__(self, out: Path, total: int, shards: int, encoder: str, dim: int, kind: str = "exact",
                 ann: dict | None = None):
        """`kind`: exact, ivf or hnsw; `ann`: build options of an approximate kind
        (nlist; m, ef_construction), defaults where absent (`ann_index.build_params`)."""
        if kind not in KINDS:
            raise IndexFileError(f"unknown index kind {kind!r} (kinds: {', '.join(KINDS)})")
        if shards < 1:
            raise IndexFileError(f"--shards must be at least 1, got {shards}")
        if total < shards:
            raise IndexFileError(f"{total} passages cannot fill {shards} shards")
        self.out, self.tmp = out, out.with_name(out.name + ".building")
        shutil.rmtree(self.tmp, ignore_errors=True)
        self.tmp.mkdir(parents=True)
        self.bounds = np.linspace(0, total, shards + 1).round().astype(int)
        self.kind, self.ann = kind, dict(ann or {})
        self.meta = {"format": FORMAT, "kind": kind, "encoder": encoder, "dim": dim, "metric": "ip",
                     "rows": total, "built_at": time.time(), "shards": []}
        self.ids, self.texts, self.vecs, self.done = [], [], [], 0

    def add(self, ids: list, texts: list, matrix: np.ndarray) -> None:
        if not np.isfinite(matrix).all():
            bad = int(np.flatnonzero(~np.isfinite(matrix).all(axis=1))[0])
            raise IndexFileError(f"passage {ids[bad]!r} has a vector with NaN or infinite values")
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
        entry = {"file": name, "rows": len(self.ids)}
        if self.kind != "exact":
            from shoal import ann_index

            try:
                params = ann_index.build_params(self.kind, len(self.ids), **self.ann)
                ann_index.save(ann_index.build(self.kind, vectors, params), self.tmp / f"{name}.faiss")
            except ann_index.AnnIndexError as e:
                raise IndexFileError(f"shard {shard}: {e}") from None
            entry["ann"] = params
            digest.update(orjson.dumps(params, option=orjson.OPT_SORT_KEYS))
        # The digest makes the manifest (and so the index's id) change with its content.
        self.meta["shards"].append({**entry, "digest": digest.hexdigest()})
        self.ids, self.texts, self.vecs = [], [], []

    def finish(self) -> dict:
        (self.tmp / "index.json").write_bytes(orjson.dumps(self.meta, option=orjson.OPT_INDENT_2))
        shutil.rmtree(self.out, ignore_errors=True)
        self.tmp.rename(self.out)
        return self.meta


def write_index(out: str | Path, ids: list[str], texts: list[str], vectors: np.ndarray, encoder: str,
                shards: int = 1, kind: str = "exact", ann: dict | None = None) -> dict:
    """An index of rows held in memory (benchmarks, small corpora)."""
    w = ShardWriter(Path(out), len(ids), shards, encoder, vectors.shape[1], kind, ann)
    w.add(list(ids), list(texts), vectors)
    return w.finish()
