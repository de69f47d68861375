"""The one append-only log under the result log, the checkpoint store and the job log:
a torn tail is cut off on open the same way for all three."""

from __future__ import annotations

import orjson
import pytest

from shoal.nodes.storage.append_log import AppendLog
from shoal.nodes.storage.checkpoint_store import CheckpointStore
from shoal.nodes.storage.job_log import JobLog
from shoal.nodes.storage.result_log import ResultLog


def test_torn_tail_is_cut_and_the_next_append_starts_clean(tmp_path):
    path = tmp_path / "log.jsonl"
    log = AppendLog(path, lambda *_: None)
    offsets = [log.append({"n": i}) for i in range(3)]
    log.close()
    whole = path.read_bytes()
    with open(path, "ab") as fh:
        fh.write(b'{"n": 3, "tru')  # a crash mid-append
    seen = []
    log = AppendLog(path, lambda off, rec: seen.append((off, rec["n"])))
    assert seen == list(zip(offsets, range(3)))
    assert path.read_bytes() == whole  # cut back to the last whole record
    log.append({"n": 4})
    log.close()
    assert [orjson.loads(x)["n"] for x in path.read_bytes().splitlines()] == [0, 1, 2, 4]


def test_a_record_its_owner_refuses_ends_the_log_there(tmp_path):
    path = tmp_path / "log.jsonl"
    path.write_bytes(b'{"id": 1}\n{"no_id": 2}\n{"id": 3}\n')
    ids = []
    AppendLog(path, lambda _, rec: ids.append(rec["id"])).close()
    assert ids == [1] and path.read_bytes() == b'{"id": 1}\n'


@pytest.mark.parametrize("make, fill, check", [
    (ResultLog, lambda log: (log.append([{"id": "a"}, {"id": "b"}]), log.commit()),
     lambda log: len(log) == 2 and "a" in log and log.read(0, 5)[1]["id"] == "b"),
    (CheckpointStore, lambda log: (log.record([{"id": "a", "state": {"ops_done": 1}}], lambda _: False), log.commit()),
     lambda log: log.get("a") == {"ops_done": 1}),
    (JobLog, lambda log: log.record({"job_id": "j", "job_key": "k", "program": "generate", "params": {}, "total": 1,
                                     "state": "done"}, epoch=3),
     lambda log: log.jobs["j"]["state"] == "done" and log.epoch == 3),
])
def test_each_log_recovers_its_records_past_a_torn_tail(tmp_path, make, fill, check):
    path = tmp_path / "x.jsonl"
    log = make(path)
    fill(log)
    log.close()
    with open(path, "ab") as fh:
        fh.write(b'{"id": "torn", "sta')
    again = make(path)
    assert check(again)
    again.close()
