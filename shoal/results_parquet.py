"""JSONL result records to a Parquet file, streaming (used by storage's compaction and
by `shoal generate --output x.parquet`).

The schema is the union of the records' keys, each typed from its first non-null value;
ids are int64 when every id is an integer, else strings (Parquet columns have one type).
The file appears under its name only when complete.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import orjson

BATCH = 4096


def iter_jsonl(path: Path) -> Iterator[dict]:
    with open(path, "rb") as fh:
        for line in fh:
            if line.endswith(b"\n"):  # a torn tail is not a record
                yield orjson.loads(line)


def _schema(path: Path):
    import pyarrow as pa

    samples: dict = {}
    ids_int = True
    for rec in iter_jsonl(path):
        ids_int = ids_int and isinstance(rec["id"], int) and not isinstance(rec["id"], bool)
        for k, v in rec.items():
            if k != "id" and v is not None and k not in samples:
                samples[k] = v
    fields = [pa.field("id", pa.int64() if ids_int else pa.string(), nullable=False)]
    fields += [pa.field(k, pa.array([v]).type) for k, v in samples.items()]
    return pa.schema(fields), ids_int


def jsonl_to_parquet(src: str | Path, out: str | Path) -> None:
    from shoal.extras import need

    pa = need("pyarrow", "node", "writing Parquet")
    pq = need("pyarrow.parquet", "node", "writing Parquet")
    src, out = Path(src), Path(out)
    schema, ids_int = _schema(src)
    tmp = out.with_name(out.name + ".tmp")
    with pq.ParquetWriter(tmp, schema) as writer:
        batch: list[dict] = []
        for rec in iter_jsonl(src):
            batch.append(rec if ids_int else {**rec, "id": str(rec["id"])})
            if len(batch) == BATCH:
                writer.write_table(pa.Table.from_pylist(batch, schema=schema))
                batch = []
        if batch:
            writer.write_table(pa.Table.from_pylist(batch, schema=schema))
    os.replace(tmp, out)
