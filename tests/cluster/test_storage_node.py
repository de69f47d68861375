"""The storage node as a real process: handshake, first-writer-wins writes acknowledged
after fsync, resumable reads, survival of kill -9, and an Error for every kind of bad
message while it keeps serving."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import orjson
import pytest

from shoal.nodes.membership import MemberView
from shoal.transport.rpc import RemoteError, RpcClient


def start_storage(data_dir, etcd=None, cluster="default"):
    cmd = [sys.executable, "-m", "shoal.nodes.storage.storage_node", "--dir", str(data_dir), "--node-id", "st-1"]
    if etcd:
        cmd += ["--etcd", etcd, "--cluster", cluster]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    line = proc.stdout.readline().strip()
    assert line.startswith("storage: tcp://"), line
    return proc, line.split(" ", 1)[1]


@pytest.fixture
def storage(tmp_path, etcd_endpoint, cluster_name):
    proc, address = start_storage(tmp_path / "st", etcd_endpoint, cluster_name)
    yield proc, address
    proc.kill()
    proc.wait()


def test_handshake_write_read_and_membership(storage, etcd_endpoint, cluster_name, tmp_path):
    proc, address = storage
    view = MemberView(etcd_endpoint, cluster_name).start()
    assert view.wait_for(lambda m: "st-1" in m, timeout=5)
    assert view.snapshot("storage")["st-1"].info["address"] == address
    c = RpcClient(address)
    ready = c.request("Hello", {"role": "client", "node_id": "t"})
    assert (ready["role"], ready["node_id"]) == ("storage", "st-1")
    ack = c.request("WriteResults", {"job_id": "j1", "records": [{"id": 1, "text": "a"}, {"id": 2, "text": "b"}]})
    assert (ack["written"], ack["duplicates"]) == (2, 0)
    ack = c.request("WriteResults", {"job_id": "j1", "records": [{"id": 2, "text": "dup"}, {"id": 3, "text": "c"}]})
    assert (ack["written"], ack["duplicates"]) == (1, 1)
    batch = c.request("Subscribe", {"job_id": "j1", "offset": 1})
    assert [r["text"] for r in batch["records"]] == ["b", "c"]
    with pytest.raises(RemoteError, match="not a valid id"):
        c.request("Subscribe", {"job_id": "../etc", "offset": 0})
    # Reading a job that has no results answers "nothing yet" and makes no files for it.
    assert c.request("Subscribe", {"job_id": "typo", "offset": 0})["records"] == []
    assert c.request("ResultCountQuery", {"job_id": "typo"})["records"] == 0
    assert not (tmp_path / "st" / "jobs" / "typo").exists() and (tmp_path / "st" / "jobs" / "j1").exists()
    view.stop()


def test_acknowledged_results_survive_kill_9(tmp_path):
    proc, address = start_storage(tmp_path / "st")
    c = RpcClient(address)
    for i in range(20):
        c.request("WriteResults", {"job_id": "j2", "records": [{"id": i, "text": str(i)}]})
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    proc2, address2 = start_storage(tmp_path / "st")
    try:
        got = RpcClient(address2).request("Subscribe", {"job_id": "j2", "offset": 0})["records"]
        assert [r["id"] for r in got] == list(range(20))
    finally:
        proc2.kill()
        proc2.wait()


def header(**over):
    h = {"v": [1, 0], "type": "Ping", "id": "x", "re": None, "blobs": [], "f": {}}
    h.update(over)
    return orjson.dumps(h)


BAD = {
    "garbage": ([b"\x00\xffnot json at all"], "malformed"),
    "empty frame": ([b""], "malformed"),
    "wrong major": ([header(v=[9, 0])], "bad_version"),
    "unknown type": ([header(type="FormatDisk")], "unknown_type"),
    "huge header": ([b"{" + b" " * (2 << 20) + b"}"], "too_large"),
    "wrong blob count": ([header(), b"stray blob"], "blob_count"),
    "unhandled type": ([header(type="AssignSequences", f={"epoch": 1, "job_id": "j", "sequences": []})], "unknown_type"),
    "bad field": ([header(type="WriteResults", f={"job_id": "j", "records": [{"no_id": 1}]})], "invalid_field"),
}


def test_bad_messages_get_errors_while_a_job_writes(storage):
    proc, address = storage
    # A "job" writing results the whole time the bad messages arrive.
    stop = threading.Event()
    written = []

    def writer():
        c = RpcClient(address)
        i = 0
        while not stop.is_set() and i < 900:  # one Subscribe page reads them all back
            c.request("WriteResults", {"job_id": "live", "records": [{"id": i}]})
            written.append(i)
            i += 1

    t = threading.Thread(target=writer)
    t.start()
    c = RpcClient(address)
    for name, (frames, code) in BAD.items():
        reply = c.raw(frames)
        assert reply.type == "Error" and reply["code"] == code, (name, reply.fields)
        assert c.request("Ping", {"sent_at": 1.0})["sent_at"] == 1.0  # still serving
    stop.set()
    t.join()
    assert proc.poll() is None and len(written) > 0
    got = c.request("Subscribe", {"job_id": "live", "offset": 0})["records"]
    assert [r["id"] for r in got] == written[: len(got)] and len(got) == len(written)


def test_a_waiting_read_is_answered_when_the_job_completes_or_its_wait_ends(tmp_path):
    proc, address = start_storage(tmp_path / "st")
    try:
        c = RpcClient(address)
        items = [{"id": n, "prompt": "p"} for n in range(3)]
        assert c.request("IngestInput", {"job_id": "jw", "items": items})["total"] == 3
        # Nothing stored: held for its whole wait, then answered with nothing.
        t = time.monotonic()
        batch = c.request("Subscribe", {"job_id": "jw", "offset": 0, "wait_ms": 300})
        assert batch["records"] == [] and not batch["final"] and time.monotonic() - t >= 0.29
        # Some stored, not all: still held for the wait (results go out once per wait,
        # not once per commit), then answered with what is there.
        c.request("WriteResults", {"job_id": "jw", "records": [{"id": 0}]})
        t = time.monotonic()
        batch = c.request("Subscribe", {"job_id": "jw", "offset": 0, "wait_ms": 300})
        assert [r["id"] for r in batch["records"]] == [0] and batch["available"] == 1 and not batch["final"]
        assert time.monotonic() - t >= 0.29
        # A read that may wait 8 s is answered as soon as the last results are stored.
        got = {}

        def read():
            t0 = time.monotonic()
            got["batch"] = RpcClient(address).request("Subscribe", {"job_id": "jw", "offset": 1, "wait_ms": 8000},
                                                      timeout=20)
            got["s"] = time.monotonic() - t0

        reader = threading.Thread(target=read)
        reader.start()
        time.sleep(0.5)
        c.request("WriteResults", {"job_id": "jw", "records": [{"id": 1}, {"id": 2}]})
        reader.join(15)
        assert [r["id"] for r in got["batch"]["records"]] == [1, 2] and got["batch"]["final"]
        assert got["s"] < 4
        # Complete: answered at once, and final.
        t = time.monotonic()
        batch = c.request("Subscribe", {"job_id": "jw", "offset": 0, "wait_ms": 8000})
        assert [r["id"] for r in batch["records"]] == [0, 1, 2] and batch["final"]
        assert c.request("Subscribe", {"job_id": "jw", "offset": 3, "wait_ms": 8000})["final"]
        assert time.monotonic() - t < 4
        with pytest.raises(RemoteError, match="wait_ms"):
            c.request("Subscribe", {"job_id": "jw", "offset": 0, "wait_ms": -1})
        assert c.request("Ping", {"sent_at": 1.0})["sent_at"] == 1.0
    finally:
        proc.kill()
        proc.wait()


def test_chunked_input_paged_reads_and_compacted_shards(tmp_path):
    import pyarrow.parquet as pq

    proc, address = start_storage(tmp_path / "st")
    try:
        c = RpcClient(address)
        items = [{"id": f"i{n}", "prompt": "word " * (n + 1)} for n in range(300)]
        data = b"".join(orjson.dumps(it) + b"\n" for it in items)
        for index in range(0, len(data) // 4096 + 1):
            ack = c.request("UploadChunk", {"upload_id": "up1", "index": index}, {"data": data[index * 4096:(index + 1) * 4096]})
            assert ack["index"] == index
        with pytest.raises(RemoteError, match="bad_input: upload nope has no chunks"):
            c.request("IngestInput", {"job_id": "jb", "upload_id": "nope"})
        assert c.request("IngestInput", {"job_id": "jb", "upload_id": "up1"})["total"] == 300
        got, offset = [], 0
        while offset < 300:
            page = c.request("ReadInput", {"job_id": "jb", "offset": offset, "limit": 128})["items"]
            got += page
            offset += len(page)
        assert got == items
        # Results arrive (one twice); once every item has one, the shards appear.
        c.request("WriteResults", {"job_id": "jb", "records": [{"id": it["id"], "text": "r"} for it in items[:200]]})
        assert not (tmp_path / "st" / "jobs" / "jb" / "results.parquet").exists()
        c.request("WriteResults", {"job_id": "jb", "records": [{"id": it["id"], "text": "r"} for it in items[199:]]})
        shard = tmp_path / "st" / "jobs" / "jb" / "results.parquet"
        for _ in range(200):  # compacted in a process of its own: done once storage counts it
            if c.request("StatsQuery")["stats"]["counters"].get("jobs.compacted"):
                break
            threading.Event().wait(0.1)
        table = pq.read_table(shard)
        assert table.num_rows == 300 and sorted(table.column("id").to_pylist()) == sorted(it["id"] for it in items)
        stats = c.request("StatsQuery")["stats"]["counters"]
        assert stats["jobs.compacted"] == 1 and stats["records.duplicate"] == 1
        # Then the finished job's per-item state is dropped (memory follows the jobs in
        # flight): reads are the same, a late copy is still a duplicate.
        for _ in range(100):
            logs = c.request("StatsQuery")["stats"]["result_logs"]
            if logs["finished"] == 1:
                break
            threading.Event().wait(0.1)
        assert logs == {"running": 0, "finished": 1, "resident_ids": 0}
        read = c.request("Subscribe", {"job_id": "jb", "offset": 150})
        assert [r["id"] for r in read["records"]] == [it["id"] for it in items[150:]] and read["final"]
        ack = c.request("WriteResults", {"job_id": "jb", "records": [{"id": "i7", "text": "late"}]})
        assert (ack["written"], ack["duplicates"]) == (0, 1)
    finally:
        proc.kill()
        proc.wait()
    # A restarted storage serves the compacted job from its compact view at once.
    proc, address = start_storage(tmp_path / "st")
    try:
        c = RpcClient(address)
        read = c.request("Subscribe", {"job_id": "jb", "offset": 0})
        assert len(read["records"]) == 300 and read["final"]
        assert c.request("StatsQuery")["stats"]["result_logs"] == {"running": 0, "finished": 1, "resident_ids": 0}
    finally:
        proc.kill()
        proc.wait()
