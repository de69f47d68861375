"""Job inputs on storage: chunked uploads reassembled across line boundaries, every
record checked with its place named, one durable normalized copy read back in pages."""

from __future__ import annotations

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from shoal.generate_input import InputError
from shoal.nodes.storage.input_store import InputStore


def jsonl(items):
    return b"".join(orjson.dumps(it) + b"\n" for it in items)


ITEMS = [{"id": i, "prompt": f"prompt number {i}" * (i % 3 + 1), **({"max_tokens": i} if i % 4 else {})}
         for i in range(1, 41)]


def test_upload_in_chunks_that_split_lines(tmp_path):
    store = InputStore(tmp_path)
    data = jsonl(ITEMS)
    chunks = [data[i:i + 97] for i in range(0, len(data), 97)]
    for index, chunk in reversed(list(enumerate(chunks))):  # arrival order does not matter
        store.put_chunk("u1", index, chunk)
    store.put_chunk("u1", 3, chunks[3])  # a re-sent chunk replaces itself
    assert store.ingest("job1", upload_id="u1") == 40
    assert not (tmp_path / "uploads" / "u1").exists()
    assert store.read("job1", 0, 100, 1 << 20) == (ITEMS, 40)
    assert store.read("job1", 38, 10, 1 << 20) == (ITEMS[38:], 40)
    # A page stops at the byte limit but always carries at least one item.
    page, nxt = store.read("job1", 0, 100, 200)
    assert 1 <= len(page) < 40 and page == ITEMS[:len(page)] and nxt == len(page)
    assert store.read("job1", 0, 1, 1) == (ITEMS[:1], 1)
    # Only the items a predicate keeps (storage skips those with results), scanning a bounded stretch.
    odd, nxt = store.read("job1", 0, 5, 1 << 20, keep=lambda it: it["id"] % 2 == 1)
    assert [it["id"] for it in odd] == [1, 3, 5, 7, 9] and nxt == 9
    assert store.read("job1", 0, 5, 1 << 20, keep=lambda it: False, scan=10) == ([], 10)
    # Ingesting again (a retried submit) changes nothing.
    assert store.ingest("job1", upload_id="u1") == 40
    assert InputStore(tmp_path).read("job1", 5, 2, 1 << 20) == (ITEMS[5:7], 7)


def test_inline_items_and_paths(tmp_path):
    store = InputStore(tmp_path / "st")
    assert store.ingest("a", items=ITEMS[:3]) == 3
    path = tmp_path / "in.jsonl"
    path.write_bytes(jsonl(ITEMS) + b"\n\n")
    assert store.ingest("b", input_path=str(path)) == 40
    table = pa.Table.from_pylist([{"id": f"r{i}", "prompt_token_ids": [i, i + 1]} for i in range(5)])
    pq.write_table(table, tmp_path / "in.parquet")
    assert store.ingest("c", input_path=str(tmp_path / "in.parquet")) == 5
    assert store.read("c", 4, 1, 1 << 20) == ([{"id": "r4", "prompt_token_ids": [4, 5]}], 5)
    assert store.ingest("empty", items=[]) == 0


@pytest.mark.parametrize("body, message", [
    (b'{"id": 1, "prompt": "a"}\n{"id": 1, "prompt": "b"}\n', r"upload u:2: duplicate id 1 \(first on line 1\)"),
    (b'{"id": 1, "prompt": "a"}\n{"id": 2, "prom', r"upload u:2: not valid JSON"),
    (b'{"id": 1, "prompt_token_ids": [1, "x"]}\n', r"upload u:1: .*list of integers"),
])
def test_bad_uploads_name_the_line_and_store_nothing(tmp_path, body, message):
    store = InputStore(tmp_path)
    store.put_chunk("u", 0, body)
    with pytest.raises(InputError, match=message):
        store.ingest("j", upload_id="u")
    assert store.total("j") is None
    assert not (tmp_path / "uploads" / "u").exists()  # a refused upload does not wait a day for its sweep
    with pytest.raises(InputError, match="no stored input"):
        store.read("j", 0, 1, 100)


def test_missing_chunks_paths_and_names(tmp_path):
    store = InputStore(tmp_path)
    store.put_chunk("u", 0, b'{"id": 1, "prompt": "a"}\n')
    store.put_chunk("u", 2, b'{"id": 2, "prompt": "a"}\n')
    with pytest.raises(InputError, match="upload u is missing chunk 1"):
        store.ingest("j", upload_id="u")
    with pytest.raises(InputError, match="upload nothing has no chunks"):
        store.ingest("j", upload_id="nothing")
    with pytest.raises(InputError, match="does not exist"):
        store.ingest("j", input_path=str(tmp_path / "absent.jsonl"))
    (tmp_path / "bad.parquet").write_bytes(b"not parquet")
    with pytest.raises(InputError, match="not a readable Parquet file"):
        store.ingest("j", input_path=str(tmp_path / "bad.parquet"))
    with pytest.raises(InputError, match="not a valid id"):
        store.put_chunk("../x", 0, b"")
    with pytest.raises(InputError, match="one way"):
        store.ingest("j", items=[{"id": 1, "prompt": "a"}], upload_id="u")


def test_pages_count_what_travels_with_each_item(tmp_path):
    """A page's byte budget covers each kept item's checkpoint too, and reading goes on
    exactly where a full page stopped."""
    store = InputStore(tmp_path)
    store.ingest("j", [{"id": i, "prompt": "x"} for i in range(10)])
    heavy = {3, 4, 5}
    extra = lambda item: 1000 if item["id"] in heavy else 0  # noqa: E731
    first, nxt = store.read("j", 0, 100, max_bytes=1500, extra=extra)
    assert [it["id"] for it in first] == [0, 1, 2, 3] and nxt == 4
    second, nxt = store.read("j", nxt, 100, max_bytes=1500, extra=extra)
    assert [it["id"] for it in second] == [4] and nxt == 5
    rest, nxt = store.read("j", nxt, 100, max_bytes=1500, extra=extra, keep=lambda it: it["id"] != 7)
    assert [it["id"] for it in rest] == [5, 6, 8, 9] and nxt == 10


def test_batches_are_cut_by_encoded_size():
    from shoal.protocol.size_limits import by_size

    assert by_size([3, 3, 3, 9, 1], lambda n: n, limit=6) == [[3, 3], [3], [9], [1]]
    assert by_size([], len) == []


def test_uploads_abandoned_part_way_are_swept_and_others_kept(tmp_path):
    import os
    import time

    store = InputStore(tmp_path)
    store.put_chunk("u-old", 0, b'{"id": 1, "prompt": "a"}\n')
    store.put_chunk("u-old", 1, b'{"id": 2, "prompt": "b"}\n')
    store.put_chunk("u-live", 0, b'{"id": 1, "prompt": "a"}\n')
    day_ago = time.time() - 25 * 3600
    for p in (tmp_path / "uploads" / "u-old").iterdir():
        os.utime(p, (day_ago, day_ago))
    assert store.sweep_uploads() == 1
    assert sorted(p.name for p in (tmp_path / "uploads").iterdir()) == ["u-live"]
    # The upload still being sent is kept, and ingests whole.
    store.put_chunk("u-live", 1, b'{"id": 2, "prompt": "b"}\n')
    assert store.ingest("j", upload_id="u-live") == 2
    assert store.sweep_uploads(now=time.time() + 10 * 24 * 3600) == 0  # nothing left to sweep


def test_an_upload_id_that_leaves_the_folder_is_refused_before_anything_is_removed(tmp_path):
    store = InputStore(tmp_path / "storage")
    assert store.ingest("kept", items=[{"id": 1, "prompt": "a"}]) == 1
    for bad in ("../jobs", "..", "a/b"):
        with pytest.raises(InputError, match="not a valid id"):
            store.ingest("j", upload_id=bad)
    assert store.total("kept") == 1 and (tmp_path / "storage" / "jobs" / "kept" / "input.jsonl").exists()
