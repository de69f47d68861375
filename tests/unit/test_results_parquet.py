"""Results to Parquet: the union of the records' fields, ids typed so that one column
holds them all, nothing lost; compaction writes both shards beside the log."""

from __future__ import annotations

import orjson
import pyarrow.parquet as pq

from shoal.nodes.storage.result_compaction import compact
from shoal.results_parquet import jsonl_to_parquet


def write(path, records, torn=b""):
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in records) + torn)
    return path


def test_integer_ids_and_fields_missing_from_some_records(tmp_path):
    recs = [{"id": i, "text": f"t{i}", "token_ids": [i, 2], "finish_reason": "length"} for i in range(5000)]
    recs.append({"id": 5000, "error": "empty prompt", "finish_reason": "error"})
    src = write(tmp_path / "r.jsonl", recs, torn=b'{"id": 9, "te')
    jsonl_to_parquet(src, tmp_path / "r.parquet")
    t = pq.read_table(tmp_path / "r.parquet")
    assert str(t.schema.field("id").type) == "int64" and t.num_rows == 5001
    rows = t.to_pylist()
    assert rows[7] == {"id": 7, "text": "t7", "token_ids": [7, 2], "finish_reason": "length", "error": None}
    assert rows[-1]["error"] == "empty prompt" and rows[-1]["text"] is None


def test_mixed_ids_become_strings(tmp_path):
    src = write(tmp_path / "r.jsonl", [{"id": 1, "text": "a"}, {"id": "b", "text": "b"}])
    jsonl_to_parquet(src, tmp_path / "r.parquet")
    assert pq.read_table(tmp_path / "r.parquet").column("id").to_pylist() == ["1", "b"]


def test_compaction_writes_jsonl_and_parquet_shards(tmp_path):
    recs = [{"id": f"q{i}", "text": "x", "token_ids": [1]} for i in range(10)]
    wal = write(tmp_path / "results.wal", recs)
    written = compact(wal)
    assert set(written) == {"jsonl", "parquet"}
    assert [orjson.loads(line) for line in (tmp_path / "results.jsonl").read_bytes().splitlines()] == recs
    assert pq.read_table(tmp_path / "results.parquet").to_pylist() == recs
    assert not list(tmp_path.glob("*.tmp"))
