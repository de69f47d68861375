"""Approximate index shards, with faiss: for corpora past a few million passages, where
exact search (one product with every vector) costs too much per query.

- `ivf`: inverted lists of flat vectors (`IndexIVFFlat`). The vectors are clustered into
  `nlist` lists by k-means on a sample; a query scans the `nprobe` lists nearest to it.
- `hnsw`: a navigable small-world graph (`IndexHNSWFlat`) of `m` links per vector, built
  with `ef_construction`; a query walks it keeping `ef` candidates.

Both store the float32 vectors themselves and score by inner product (the encoder's
vectors are normalized: cosine). The build parameters and the search defaults live in
the index manifest; a query may set its own `nprobe` / `ef`. faiss is imported only
when an approximate index is built or loaded (`pip install faiss-cpu`; a GPU host may
install a GPU build of faiss instead: the file format is the same).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from shoal.protocol.errors import ShoalError

KINDS = ("ivf", "hnsw")
# Search defaults, measured on 1M vectors of intrinsic dimension 32 in 384 dimensions
# (scripts/bench_ann_index.py): recall@10 >= 0.95 against exact search.
DEFAULT_NPROBE_FRACTION = 0.1  # of the lists: ivf's default nprobe
HNSW_M, HNSW_EF_CONSTRUCTION, HNSW_EF_SEARCH = 32, 80, 160
TRAIN_POINTS_PER_LIST = 64  # k-means sample (faiss wants at least 39 per list)
SEARCH_PARAMS = {"ivf": "nprobe", "hnsw": "ef"}


class AnnIndexError(ShoalError, ValueError):
    """faiss missing, or parameters an index cannot take; the message says which."""


def _faiss():
    try:
        import faiss
    except ImportError:
        raise AnnIndexError("approximate indexes need faiss: pip install faiss-cpu (or a GPU build of faiss)") from None
    return faiss


def default_nlist(rows: int) -> int:
    """About 4 * sqrt(rows) lists, never fewer than 39 training points each."""
    return max(1, min(round(4 * math.sqrt(rows)), rows // 39))


def build_params(kind: str, rows: int, nlist: int | None = None, m: int | None = None,
                 ef_construction: int | None = None) -> dict:
    """The build parameters and search defaults an index of `rows` vectors gets."""
    if kind == "ivf":
        nlist = nlist or default_nlist(rows)
        if not 1 <= nlist <= rows:
            raise AnnIndexError(f"nlist must be between 1 and the shard's {rows} rows, got {nlist}")
        return {"nlist": nlist, "nprobe": max(1, math.ceil(nlist * DEFAULT_NPROBE_FRACTION))}
    if kind == "hnsw":
        m = m or HNSW_M
        if m < 2:
            raise AnnIndexError(f"m must be at least 2, got {m}")
        return {"m": m, "ef_construction": ef_construction or HNSW_EF_CONSTRUCTION, "ef": HNSW_EF_SEARCH}
    raise AnnIndexError(f"unknown approximate index kind {kind!r} (kinds: {', '.join(KINDS)})")


def build(kind: str, vectors: np.ndarray, params: dict):
    """A faiss index of float32 `vectors` (row i is id i), built deterministically."""
    faiss = _faiss()
    vectors = np.ascontiguousarray(vectors, dtype=np.float32)
    rows, dim = vectors.shape
    if kind == "ivf":
        index = faiss.IndexIVFFlat(faiss.IndexFlatIP(dim), dim, params["nlist"], faiss.METRIC_INNER_PRODUCT)
        sample = min(rows, TRAIN_POINTS_PER_LIST * params["nlist"])
        pick = np.sort(np.random.default_rng(0).choice(rows, sample, replace=False)) if sample < rows else slice(None)
        index.train(vectors[pick])
        index.add(vectors)
        index.nprobe = params["nprobe"]
    else:
        index = faiss.IndexHNSWFlat(dim, params["m"], faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = params["ef_construction"]
        index.add(vectors)
        index.hnsw.efSearch = params["ef"]
    return index


def save(index, path: Path) -> None:
    _faiss().write_index(index, str(path))


def load(path: Path):
    return _faiss().read_index(str(path))


def search(kind: str, index, queries: np.ndarray, k: int, value: int) -> tuple[np.ndarray, np.ndarray]:
    """(scores, rows), each [queries, k], best first; rows of -1 where fewer than k
    vectors were reached. `value` is the query's nprobe (ivf) or ef (hnsw)."""
    faiss = _faiss()
    if kind == "ivf":
        params = faiss.SearchParametersIVF(nprobe=max(1, int(value)))
    else:
        params = faiss.SearchParametersHNSW(efSearch=max(int(value), k))
    return index.search(np.ascontiguousarray(queries, dtype=np.float32), k, params=params)
