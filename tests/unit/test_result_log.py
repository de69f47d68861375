from shoal.nodes.storage.result_log import ResultLog


def test_first_writer_wins_and_offsets(tmp_path):
    log = ResultLog(tmp_path / "r.wal")
    assert log.append([{"id": 1, "text": "a"}, {"id": "x", "text": "b"}]) == (2, 0)
    assert log.append([{"id": 1, "text": "late duplicate"}, {"id": 2, "text": "c"}]) == (1, 1)
    log.commit()
    assert [r["text"] for r in log.read(0, 10)] == ["a", "b", "c"]
    assert [r["id"] for r in log.read(1, 1)] == ["x"]
    assert log.read(3, 5) == []


def test_recovery_cuts_a_torn_tail(tmp_path):
    path = tmp_path / "r.wal"
    log = ResultLog(path)
    log.append([{"id": i} for i in range(3)])
    log.close()
    with open(path, "ab") as fh:
        fh.write(b'{"id": 99, "tex')  # a crash mid-write
    again = ResultLog(path)
    assert len(again) == 3 and again.append([{"id": 2}, {"id": 3}]) == (1, 1)
    again.commit()
    assert [r["id"] for r in again.read(0, 10)] == [0, 1, 2, 3]


def test_reads_stop_at_a_byte_budget_but_return_at_least_one(tmp_path):
    from shoal.nodes.storage.result_log import ResultLog

    log = ResultLog(tmp_path / "r.wal")
    log.append([{"id": i, "text": "x" * 100} for i in range(5)])
    assert [r["id"] for r in log.read(0, 10, max_bytes=250)] == [0, 1]
    assert [r["id"] for r in log.read(4, 10, max_bytes=10)] == [4]
    assert len(log.read(0, 10)) == 5
    log.close()
