"""Reading the output of an embedding job (`shoal embed --output DIR`).

    from shoal.sdk.embeddings import EmbeddingSet
    out = EmbeddingSet("emb/")
    table = out.partition("part-7")       # id, partition, row, vector; in input order
    ids, matrix = out.matrix("part-7")    # numpy [rows, dim]
    out.missing()                         # partitions not (fully) covered yet

Only SuperBatches recorded in the manifest are read: a file left by a crash before
its manifest line is not part of the output.
"""

from __future__ import annotations

from pathlib import Path

import orjson

from shoal.embedding_output import read_manifest


class EmbeddingSet:
    def __init__(self, folder: str | Path):
        self.folder = Path(folder)
        header, entries, _ = read_manifest(self.folder)
        if header is None:
            raise FileNotFoundError(f"{self.folder} holds no embedding output (no manifest.jsonl)")
        self.header, self.entries = header, entries
        self.partitions: dict[str, int] = dict(orjson.loads((self.folder / "partitions.json").read_bytes()))
        self._files: dict[str, list[str]] = {}
        self.covered: dict[str, int] = {}
        for e in entries:
            for name, start, end in e["slices"]:
                self._files.setdefault(name, []).append(e["file"])
                self.covered[name] = self.covered.get(name, 0) + end - start

    @property
    def dim(self) -> int:
        return self.header["dim"]

    @property
    def rows(self) -> int:
        return sum(e["rows"] for e in self.entries)

    @property
    def truncated(self) -> int:
        return sum(e.get("truncated", 0) for e in self.entries)

    def missing(self) -> dict[str, int]:
        """Partition -> rows not yet embedded."""
        return {n: size - self.covered.get(n, 0) for n, size in self.partitions.items() if self.covered.get(n, 0) < size}

    def partition(self, name: str):
        """A partition's embeddings as a pyarrow Table ordered by row."""
        import pyarrow as pa
        import pyarrow.compute as pc
        import pyarrow.parquet as pq

        if name not in self.partitions:
            raise KeyError(f"no partition {name!r} in {self.folder}")
        parts = []
        for f in dict.fromkeys(self._files.get(name, [])):
            t = pq.read_table(self.folder / f)
            parts.append(t.filter(pc.equal(t["partition"], name)))
        if not parts:
            return pa.table({"id": pa.array([], pa.string()), "partition": pa.array([], pa.string()),
                             "row": pa.array([], pa.int64()),
                             "vector": pa.array([], pa.list_(pa.float32(), self.dim))})
        table = pa.concat_tables(parts)
        return table.take(pc.sort_indices(table["row"]))

    def matrix(self, name: str):
        """(ids, numpy [rows, dim]) of a partition, in input order."""
        import numpy as np

        t = self.partition(name)
        flat = t["vector"].combine_chunks().flatten().to_numpy(zero_copy_only=False)
        return t["id"].to_pylist(), np.asarray(flat).reshape(t.num_rows, self.dim)
