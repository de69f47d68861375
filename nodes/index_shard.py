"""One loaded shard of a vector index, searched exactly on a storage node.

A search takes the queries of many sequences at once: one matrix product of the
queries [q, dim] with the shard's vectors [rows, dim], then top-k per query under the
ordering of `shoal.topk` (score, then id), so shards merge into the global top-k.
Exact search keeps a float64 copy of the vectors: twice their size in memory; an
approximate index kind (the seam in `vector_index.py`) is the answer for larger shards.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from shoal.topk import top_k
from shoal.vector_index import IndexFileError, read_manifest, shard_files


class IndexShard:
    def __init__(self, folder: str | Path, shard: int):
        import pyarrow.parquet as pq
        from safetensors.numpy import load_file

        self.folder = Path(folder)
        self.meta = read_manifest(self.folder)
        self.shard = shard
        vectors, texts = shard_files(self.folder, self.meta, shard)
        for f in (vectors, texts):
            if not f.exists():
                raise IndexFileError(f"index {self.folder}: shard {shard} file {f.name} is missing")
        self.vectors = load_file(str(vectors))["vectors"]
        table = pq.read_table(texts)
        self.ids = np.asarray(table["id"].to_pylist(), dtype=object)
        self.texts = table["text"].to_pylist()
        if self.vectors.shape != (len(self.ids), self.meta["dim"]):
            raise IndexFileError(f"index {self.folder}: shard {shard} holds vectors {self.vectors.shape} for "
                              f"{len(self.ids)} passages of dimension {self.meta['dim']}")

        self._vectors64 = self.vectors.astype(np.float64)

    @property
    def rows(self) -> int:
        return len(self.ids)

    def search(self, queries: np.ndarray, k: int) -> list[list[dict]]:
        """Per query, up to k hits {"id", "score", "text"}, best first."""
        if queries.ndim != 2 or queries.shape[1] != self.meta["dim"]:
            raise IndexFileError(f"queries of shape {tuple(queries.shape)} do not match this index's dimension "
                              f"{self.meta['dim']}")
        # float64 products of float32 inputs, rounded back: a query scores the same
        # whatever else shares its batch (float32 GEMM blocking would not promise that).
        scores = (queries.astype(np.float64) @ self._vectors64.T).astype(np.float32)
        rows, best = top_k(scores, self.ids, k)
        return [[{"id": self.ids[r], "score": float(s), "text": self.texts[r]} for r, s in zip(rr, ss)]
                for rr, ss in zip(rows, best)]
