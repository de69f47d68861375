"""An embedding corpus on storage: rows read back by (partition, row range) exactly as
they were in the input, partitions by file or by column, bad rows named by file and
line (stop or skip), and the output directory's atomic SuperBatches and manifest."""

from __future__ import annotations

import random

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from shoal.corpus_reader import CorpusSpec
from shoal.sdk.embeddings import EmbeddingSet
from shoal.generate_input import InputError
from shoal.nodes.storage import corpus_store
from shoal.nodes.storage.corpus_store import CorpusStore
from shoal.embedding_output import EmbeddingOutput, OutputMismatch


def write_jsonl(path, rows):
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    return str(path)


def test_file_partitions_read_back_in_input_order(tmp_path):
    a = write_jsonl(tmp_path / "alpha.jsonl", [{"id": f"a{i}", "text": f"text a {i}"} for i in range(7)])
    b = write_jsonl(tmp_path / "beta.jsonl", [{"text": f"text b {i}"} for i in range(3)])  # ids from file and line
    empty = write_jsonl(tmp_path / "gamma.jsonl", [])
    corpus = CorpusStore(tmp_path / "store").ingest("j1", CorpusSpec((a, b, empty)))
    assert corpus.partitions == [("alpha", 7), ("beta", 3), ("gamma", 0)]
    assert corpus.meta["empty"] == ["gamma"] and corpus.total == 10
    assert corpus.read("alpha", 2, 5) == [("a2", "text a 2"), ("a3", "text a 3"), ("a4", "text a 4")]
    assert corpus.read("beta", 0, 3) == [("beta:1", "text b 0"), ("beta:2", "text b 1"), ("beta:3", "text b 2")]
    assert corpus.read("gamma", 0, 0) == []
    with pytest.raises(InputError, match="outside partition 'beta'"):
        corpus.read("beta", 2, 4)
    with pytest.raises(InputError, match="no partition 'delta'"):
        corpus.read("delta", 0, 1)


def test_column_partitions_spread_over_files_and_chunks(tmp_path, monkeypatch):
    monkeypatch.setattr(corpus_store, "CHUNK_ROWS", 7)  # many chunks: rows of a partition cross them
    rng = random.Random(3)
    expect: dict[str, list] = {}
    inputs = []
    for f in range(3):
        rows = []
        for i in range(50):
            part = f"p{rng.randrange(6)}"
            row = {"id": f"{f}-{i}", "text": "w" * rng.randrange(1, 30), "group": part}
            rows.append(row)
            expect.setdefault(part, []).append((row["id"], row["text"]))
        inputs.append(write_jsonl(tmp_path / f"f{f}.jsonl", rows))
    table = pa.table({"id": ["pq-0", "pq-1"], "text": ["from parquet", "again"], "group": ["p0", "p9"]})
    pq.write_table(table, tmp_path / "more.parquet")
    inputs.append(str(tmp_path / "more.parquet"))
    expect["p0"].append(("pq-0", "from parquet"))
    expect["p9"] = [("pq-1", "again")]
    corpus = CorpusStore(tmp_path / "store").ingest("j1", CorpusSpec(tuple(inputs), partition_by="group"))
    assert dict(corpus.partitions) == {p: len(rows) for p, rows in expect.items()}
    for part, rows in expect.items():
        assert corpus.read(part, 0, len(rows)) == rows
        assert corpus.read(part, 1, min(3, len(rows))) == rows[1:3]


def test_bad_rows_stop_the_job_or_are_skipped_and_reported(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_bytes(b'{"text": "fine"}\n{not json\n\n[1, 2]\n{"text": 5}\n{"text": "ok", "id": [1]}\n{"text": "last"}\n')
    with pytest.raises(InputError, match=r"bad.jsonl:line 2: not valid JSON"):
        CorpusStore(tmp_path / "s1").ingest("j1", CorpusSpec((str(path),)))
    assert not (tmp_path / "s1" / "jobs" / "j1" / "corpus").exists()  # a refused input leaves nothing
    corpus = CorpusStore(tmp_path / "s2").ingest("j1", CorpusSpec((str(path),), on_error="skip"))
    assert corpus.total == 2 and corpus.meta["skipped"] == 4
    assert [e.split(": ", 1)[0].rsplit("/", 1)[1] for e in corpus.meta["errors"]] == \
        ["bad.jsonl:line 2", "bad.jsonl:line 4", "bad.jsonl:line 5", "bad.jsonl:line 6"]
    assert corpus.read("bad", 0, 2) == [("bad:1", "fine"), ("bad:7", "last")]


def test_missing_files_and_clashing_partition_names_are_refused(tmp_path):
    with pytest.raises(InputError, match="nope.jsonl does not exist"):
        CorpusStore(tmp_path / "s").ingest("j1", CorpusSpec((str(tmp_path / "nope.jsonl"),), on_error="skip"))
    (tmp_path / "d").mkdir()
    a = write_jsonl(tmp_path / "x.jsonl", [{"text": "a"}])
    b = write_jsonl(tmp_path / "d" / "x.jsonl", [{"text": "b"}])
    with pytest.raises(InputError, match="would both be partition 'x'"):
        CorpusStore(tmp_path / "s").ingest("j1", CorpusSpec((a, b)))
    with pytest.raises(InputError, match="partition column 'g'"):
        CorpusStore(tmp_path / "s").ingest("j2", CorpusSpec((a,), partition_by="g"))


def vectors_table(ids, part, rows, dim, value):
    return pa.table({"id": ids, "partition": [part] * len(ids), "row": rows,
                     "vector": pa.FixedSizeListArray.from_arrays(pa.array([value] * (len(ids) * dim), pa.float32()), dim)})


def test_output_manifest_skips_what_it_has_and_refuses_another_header(tmp_path):
    header = {"encoder": "e1", "dim": 2, "dtype": "float32", "corpus": "c1"}
    partitions = [["p", 4]]
    out = EmbeddingOutput(tmp_path / "out", header, partitions)
    assert out.write("sb-1", [["p", 0, 2]], vectors_table(["a", "b"], "p", [0, 1], 2, 1.0))
    assert not out.write("sb-1", [["p", 0, 2]], vectors_table(["a", "b"], "p", [0, 1], 2, 9.0))  # re-sent
    out.close()
    with open(tmp_path / "out" / "manifest.jsonl", "ab") as fh:  # a crash mid-append
        fh.write(b'{"id": "sb-2", "fi')
    (tmp_path / "out" / "sb-2.parquet").write_bytes(b"left by a crash before its manifest line")
    again = EmbeddingOutput(tmp_path / "out", header, partitions)
    assert set(again.done) == {"sb-1"} and again.rows == 2
    assert again.write("sb-2", [["p", 2, 4]], vectors_table(["c", "d"], "p", [3, 2], 2, 2.0))
    again.close()
    result = EmbeddingSet(tmp_path / "out")
    assert result.missing() == {}
    ids, matrix = result.matrix("p")
    assert ids == ["a", "b", "d", "c"] and matrix.tolist() == [[1, 1], [1, 1], [2, 2], [2, 2]]
    for key, value in (("dim", 3), ("encoder", "e2"), ("corpus", "c2"), ("dtype", "float16")):
        with pytest.raises(OutputMismatch, match=f"holds embeddings with {key}"):
            EmbeddingOutput(tmp_path / "out", {**header, key: value}, partitions)
