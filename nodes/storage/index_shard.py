"""One loaded shard of a vector index, searched on a storage node.

A search takes the queries of many sequences at once. Exact: one matrix product of the
queries [q, dim] with the shard's vectors [rows, dim], then top-k per query under the
ordering of `shoal.topk` (score, then id), so shards merge into the global top-k; it
keeps a float64 copy of the vectors (three times their float32 size in memory with the
vectors). Approximate (kinds ivf, hnsw): the shard's faiss index alone is loaded, and
each query's hits come back in the same order; queries that ask for their own nprobe /
ef are searched in groups of equal value.
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
        self.kind = self.meta["kind"]
        self.ann = self.meta["shards"][shard].get("ann") or {}
        vectors, texts, faiss_file = shard_files(self.folder, self.meta, shard)
        for f in (texts, vectors if self.kind == "exact" else faiss_file):
            if not f.exists():
                raise IndexFileError(f"index {self.folder}: shard {shard} file {f.name} is missing")
        table = pq.read_table(texts)
        self.ids = np.asarray(table["id"].to_pylist(), dtype=object)
        self.texts = table["text"].to_pylist()
        if self.kind != "exact":
            from shoal import ann_index

            self.index = ann_index.load(faiss_file)
            shape = (self.index.ntotal, self.index.d)
        else:
            self.vectors = load_file(str(vectors))["vectors"]
            shape = self.vectors.shape
            self._vectors64 = self.vectors.astype(np.float64)
        if shape != (len(self.ids), self.meta["dim"]):
            raise IndexFileError(f"index {self.folder}: shard {shard} holds vectors {shape} for "
                                 f"{len(self.ids)} passages of dimension {self.meta['dim']}")

    @property
    def rows(self) -> int:
        return len(self.ids)

    def search(self, queries: np.ndarray, k: int, params: list[dict] | None = None) -> list[list[dict]]:
        """Per query, up to k hits {"id", "score", "text"}, best first. `params`: per
        query, its approximate search setting ({"nprobe": n} or {"ef": n}; {} for the
        shard's default); exact search has none."""
        if queries.ndim != 2 or queries.shape[1] != self.meta["dim"]:
            raise IndexFileError(f"queries of shape {tuple(queries.shape)} do not match this index's dimension "
                              f"{self.meta['dim']}")
        if self.kind != "exact":
            return self._search_ann(queries, k, params or [{}] * len(queries))
        # float64 products of float32 inputs, rounded back: a query scores the same
        # whatever else shares its batch (float32 GEMM blocking would not promise that).
        scores = (queries.astype(np.float64) @ self._vectors64.T).astype(np.float32)
        rows, best = top_k(scores, self.ids, k)
        return [[{"id": self.ids[r], "score": float(s), "text": self.texts[r]} for r, s in zip(rr, ss)]
                for rr, ss in zip(rows, best)]

    def _search_ann(self, queries: np.ndarray, k: int, params: list[dict]) -> list[list[dict]]:
        from shoal import ann_index

        name = ann_index.SEARCH_PARAMS[self.kind]
        values = [int(p.get(name) or self.ann[name]) for p in params]
        out: list = [None] * len(queries)
        for value in sorted(set(values)):
            rows = [i for i, v in enumerate(values) if v == value]
            scores, found = ann_index.search(self.kind, self.index, queries[rows], min(k, self.rows), value)
            for i, ss, rr in zip(rows, scores, found):
                # Ties in the order exact search gives them (score, then id): shards merge alike.
                hits = sorted(((-float(s), self.ids[r], int(r)) for s, r in zip(ss, rr) if r >= 0))
                out[i] = [{"id": pid, "score": -neg, "text": self.texts[r]} for neg, pid, r in hits]
        return out
