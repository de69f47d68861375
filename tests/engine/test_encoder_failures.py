"""The encoder failing. A SuperBatch micro-batch that runs the device out of memory is
split in two and encoded in halves, and the runner's micro-batches stay at the size
that ran: no SuperBatch retries the same micro-batch forever, and every vector is the
one a run with room would give. The queue of Embed and Retrieve texts halves its budget
and calls again, rather than failing its requests; a call that fails otherwise fails
only the requests that fail alone; a lost device is said to the worker."""

from __future__ import annotations

import time

import pytest
import torch

from shoal.nodes.worker.encode_queue import EncodeQueue
from shoal.nodes.worker.step_failures import DeviceLost
from shoal.nodes.worker.superbatch_runner import SuperBatchRunner


class OutOfMemoryError(RuntimeError):  # as torch names it
    pass


class SmallDeviceEncoder:
    """Encodes a text to [its length, its first token]; raises out of memory for
    micro-batches over `room` padded tokens."""

    dim, token_budget = 2, 512

    def __init__(self, room: int):
        self.room, self.batches = room, []

    def tokenize_counted(self, texts):
        return [[int(w) for w in t.split()] for t in texts], 0

    def tokenize(self, texts):
        return self.tokenize_counted(texts)[0]

    def encode_tokenized(self, ids, token_budget):
        """As the encoder does: length-sorted micro-batches within the budget."""
        from shoal.scheduler.superbatch import micro_batches

        order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
        out = torch.empty(len(ids), self.dim)
        for cut in micro_batches([len(ids[i]) for i in order], token_budget):
            rows = order[cut.start:cut.stop]
            out[rows] = self.encode_ids([ids[i] for i in rows])
        return out

    def encode_ids(self, batch):
        padded = len(batch) * max(map(len, batch))
        if padded > self.room:
            raise OutOfMemoryError(f"CUDA out of memory (a batch of {padded} tokens)")
        self.batches.append(padded)
        return torch.tensor([[len(ids), ids[0]] for ids in batch], dtype=torch.float32)


def texts(n: int) -> list[tuple[str, str]]:
    return [(f"t{i}", " ".join(str(i + j) for j in range(1 + i % 13))) for i in range(n)]


def run(runner, job: str, n: int) -> dict:
    """The SuperBatch's vectors by text id, as the blob storage receives has them."""
    import pyarrow as pa

    assert runner.assign(job, {"id": f"{job}-sb", "slices": [["p0", 0, n]]}, "float32")
    end = time.monotonic() + 10
    while not runner.has_work():
        assert time.monotonic() < end, "the SuperBatch was never read"
        time.sleep(0.01)
    while True:
        done = runner.step()
        if done:
            table = pa.ipc.open_stream(done[0][1]).read_all().to_pydict()
            return dict(zip(table["id"], table["vector"]))


def test_a_micro_batch_out_of_memory_is_split_and_the_budget_stays_lowered():
    rows = texts(64)
    encoder = SmallDeviceEncoder(room=300)
    runner = SuperBatchRunner(encoder, lambda job, slices: rows)
    try:
        vectors = run(runner, "a", len(rows))
        for tid, text in rows:
            ids = [int(w) for w in text.split()]
            assert vectors[tid] == [len(ids), ids[0]], tid
        assert runner.counters["embed.oom_splits"] >= 1
        assert runner.token_budget <= 300 and max(encoder.batches) <= 300
        splits = runner.counters["embed.oom_splits"]
        run(runner, "b", len(rows))  # planned at the lowered budget: nothing to split
        assert runner.counters["embed.oom_splits"] == splits
    finally:
        runner.close()


def test_a_text_out_of_memory_alone_is_raised_not_split():
    rows = texts(4)
    runner = SuperBatchRunner(SmallDeviceEncoder(room=0), lambda job, slices: rows)
    try:
        runner.assign("a", {"id": "a-sb", "slices": [["p0", 0, 4]]}, "float32")
        end = time.monotonic() + 10
        while not runner.has_work():
            assert time.monotonic() < end
            time.sleep(0.01)
        raised = 0
        for _ in range(20):
            try:
                runner.step()
            except OutOfMemoryError:
                raised += 1
        # 4 texts, then 2, then one alone: raised, not split again (the worker logs it and retries)
        assert runner.counters["embed.oom_splits"] == 2 and raised == 18
    finally:
        runner.close()


def test_the_queue_of_embed_texts_halves_its_budget_out_of_memory_and_fails_no_request():
    encoder = SmallDeviceEncoder(room=200)
    queue = EncodeQueue(encoder, token_budget=1024)
    got = {}
    rows = texts(48)
    for tid, text in rows:
        queue.put(tid, [text], lambda v, tid=tid: got.setdefault(tid, v))
    while len(queue):
        queue.run()
    assert sorted(got) == sorted(tid for tid, _ in rows)
    for tid, text in rows:
        ids = [int(w) for w in text.split()]
        assert not isinstance(got[tid], Exception), got[tid]
        assert got[tid].tolist() == [[len(ids), ids[0]]], tid
    assert queue.token_budget <= 256 and queue.stats["oom_halvings"] >= 2


def test_a_lost_device_under_the_queue_is_said_to_the_worker():
    class LostDevice(SmallDeviceEncoder):
        def encode_ids(self, batch):
            raise RuntimeError("CUDA error: an illegal memory access was encountered")

    queue = EncodeQueue(LostDevice(room=0), token_budget=512)
    failed = []
    queue.put("q", ["1 2 3"], failed.append)
    with pytest.raises(DeviceLost, match="illegal memory access"):
        queue.run()
    assert not failed  # its request is not failed: it resumes elsewhere


def test_a_text_the_encoder_cannot_take_fails_only_its_own_request():
    class Picky(SmallDeviceEncoder):
        def encode_ids(self, batch):
            if any(13 in ids for ids in batch):
                raise ValueError("token 13 breaks the encoder")
            return super().encode_ids(batch)

    queue = EncodeQueue(Picky(room=10**6), token_budget=512)
    got = {}
    rows = [("a", "1 2"), ("bad", "4 13 5"), ("c", "7")]
    for tid, text in rows:
        queue.put(tid, [text], lambda v, tid=tid: got.setdefault(tid, v))
    while len(queue):
        queue.run()
    assert isinstance(got["bad"], ValueError) and "token 13" in str(got["bad"])
    assert got["a"].tolist() == [[2, 1]] and got["c"].tolist() == [[1, 7]]
