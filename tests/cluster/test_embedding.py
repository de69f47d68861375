"""Bulk embedding through a real local cluster: vectors equal sentence-transformers' on
the same folder, in input order per partition; memory stays within the SuperBatch bound
(the pipeline's own high-water counters); bad input gets an error that names it."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from embed_corpus import write_corpus

import shoal
from shoal.sdk.embeddings import EmbeddingSet
from shoal.transport.rpc import RemoteError, RpcClient

IN_FLIGHT = 2


def stats(address: str) -> dict:
    return RpcClient(address).request("StatsQuery", {}, timeout=10)["stats"]


def check_output(out: EmbeddingSet, expect: dict) -> dict:
    """Every row exactly once, in input order per partition; returns partition -> matrix."""
    assert out.missing() == {}
    ids = [e["id"] for e in out.entries]
    assert len(ids) == len(set(ids)), "a SuperBatch is in the manifest twice"
    got = {}
    for part, rows in expect.items():
        pid, matrix = out.matrix(part)
        assert pid == [i for i, _ in rows]
        got[part] = matrix
    return got


def test_embed_matches_sentence_transformers_within_the_memory_bound(minilm, tmp_path):
    from sentence_transformers import SentenceTransformer

    sizes = [37, 0, 5, 120, 1, 64]  # an empty partition, one larger than n_max, tiny ones
    paths, expect = write_corpus(tmp_path / "in", sizes, long_texts=2)
    with shoal.LocalCluster(encoder=minilm, workers=1, state_dir=tmp_path / "c",
                            scheduler_args=["--superbatches-in-flight", str(IN_FLIGHT)]) as c:
        client = shoal.Client(c.router)
        worker = c.nodes["worker-0"][2]
        highwater = []
        for b_min, n_max, dtype in ((16, 8, "float32"), (48, 32, "float16")):  # two jobs of different bounds
            job = client.embed(paths, tmp_path / f"out-{dtype}", minilm, b_min=b_min, n_max=n_max, vector_dtype=dtype)
            assert job.total == sum(sizes) and job.detail["empty"] == ["p1"] and job.detail["done"] == 0
            assert job.wait_until_done(timeout=240)["state"] == "done"
            hw = stats(worker)["superbatches"]["highwater"]
            storage_hw = stats(c.nodes["storage-0"][2])["highwater"]
            assert b_min < hw["texts_buffered"] <= IN_FLIGHT * (b_min + n_max - 1)
            assert hw["superbatches_held"] == IN_FLIGHT  # the bound was reached, never passed
            assert storage_hw["texts_per_read"] <= b_min + n_max - 1
            assert storage_hw["rows_per_write"] <= b_min + n_max - 1
            highwater.append(hw["texts_buffered"])
        assert highwater[0] <= IN_FLIGHT * (16 + 8 - 1)  # the first job's peak, measured before the second ran
    fp32 = check_output(EmbeddingSet(tmp_path / "out-float32"), expect)
    fp16 = check_output(EmbeddingSet(tmp_path / "out-float16"), expect)
    assert EmbeddingSet(tmp_path / "out-float32").truncated == 2
    st = SentenceTransformer(str(minilm), device="cpu")
    for part, rows in expect.items():
        if not rows:
            assert fp32[part].shape == (0, 384)
            continue
        ref = st.encode([t for _, t in rows], convert_to_numpy=True)
        cos = (fp32[part] * ref).sum(1) / np.linalg.norm(fp32[part], axis=1) / np.linalg.norm(ref, axis=1)
        assert cos.min() >= 0.9999, part
        assert fp16[part].dtype == np.float16
        assert np.abs(fp16[part].astype(np.float32) - fp32[part]).max() < 2e-3


def test_bad_input_is_named_and_a_mismatched_output_refused(tiny_encoder, minilm, tmp_path):
    from shoal.nodes.worker.models.make_encoder import make_encoder

    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(b'{"id": "a", "text": "fine"}\n{"id": "b", "text": \n{"id": "c", "text": "also fine"}\n')
    good, _ = write_corpus(tmp_path / "in", [5, 3])
    with shoal.LocalCluster(encoder=tiny_encoder, workers=1, state_dir=tmp_path / "c") as c:
        client = shoal.Client(c.router)
        with pytest.raises(RemoteError, match=r"bad.jsonl:line 2: not valid JSON"):
            client.embed([str(bad)], tmp_path / "o1", tiny_encoder)
        with pytest.raises(RemoteError, match=r"nope.jsonl does not exist"):
            client.embed([str(tmp_path / "nope.jsonl")], tmp_path / "o1", tiny_encoder, on_error="skip")
        job = client.embed([str(bad)], tmp_path / "o1", tiny_encoder, on_error="skip")
        assert job.detail["skipped"] == 1 and "bad.jsonl:line 2" in job.detail["errors"][0]
        assert job.wait_until_done(timeout=120)["state"] == "done"
        ids, matrix = EmbeddingSet(tmp_path / "o1").matrix("bad")
        assert ids == ["a", "c"] and matrix.shape == (2, 32)

        job = client.embed(good, tmp_path / "o2", tiny_encoder, b_min=4, n_max=2)
        assert job.wait_until_done(timeout=120)["state"] == "done"
        other = make_encoder(tmp_path / "enc48", minilm, hidden=48)  # resuming with another encoder
        with pytest.raises(RemoteError, match=r"holds embeddings with dim 32, this job makes dim 48"):
            client.embed(good, tmp_path / "o2", other, b_min=4, n_max=2)
        with pytest.raises(RemoteError, match=r"holds embeddings with dtype 'float32'"):
            client.embed(good, tmp_path / "o2", tiny_encoder, b_min=4, n_max=2, vector_dtype="float16")
        with pytest.raises(RemoteError, match=r"holds embeddings with packing"):
            client.embed(good, tmp_path / "o2", tiny_encoder, b_min=8, n_max=2)
        again = client.embed(good, tmp_path / "o2", tiny_encoder, b_min=4, n_max=2, job_key="a rerun")
        assert again.detail["done"] == 8 and again.wait_until_done(timeout=60)["done"] == 8
        assert len(EmbeddingSet(tmp_path / "o2").entries) == 2  # 8 texts, B_min 4: nothing written twice

        # A worker refuses SuperBatches of an encoder it does not host; storage refuses
        # vectors that do not fit the output.
        with pytest.raises(RemoteError, match="hosts encoder"):
            RpcClient(c.nodes["worker-0"][2]).request("AssignSuperBatches", {
                "epoch": 10**6, "job_id": job.id, "superbatches": [], "storage": c.nodes["storage-0"][2],
                "encoder": "another"}, timeout=10)
        table = pa.table({"id": ["x"], "partition": ["p0"], "row": pa.array([0], pa.int64()),
                          "vector": pa.FixedSizeListArray.from_arrays(pa.array([0.5] * 8, pa.float32()), 8)})
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, table.schema) as w:
            w.write_table(table)
        with pytest.raises(RemoteError, match=r"column 'vector' must be fixed_size_list<item: float>\[32\]"):
            RpcClient(c.nodes["storage-0"][2]).request("WriteEmbeddings", {
                "job_id": job.id, "superbatch": {"id": "sb-x", "slices": [["p0", 0, 1]]},
                "encoder": EmbeddingSet(tmp_path / "o2").header["encoder"]}, {"table": sink.getvalue().to_pybytes()},
                timeout=10)
        assert c.process("storage-0").poll() is None and c.process("worker-0").poll() is None
