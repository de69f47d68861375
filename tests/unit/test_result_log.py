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
    assert len(log) == 0 and log.read(0, 10) == []  # not durable yet: not read, not counted
    log.commit()
    assert [r["id"] for r in log.read(0, 10, max_bytes=250)] == [0, 1]
    assert [r["id"] for r in log.read(4, 10, max_bytes=10)] == [4]
    assert len(log.read(0, 10)) == 5
    log.close()


def test_a_finished_job_s_compact_view_reads_as_its_log_did(tmp_path):
    """Every window, across the sparse index's strides, with the byte budget; failures
    counted; late writes are duplicates; and none of the per-item state is kept."""
    import random

    from shoal.nodes.storage.finished_results import STRIDE, FinishedResults

    log = ResultLog(tmp_path / "r.wal")
    n = 2 * STRIDE + 37
    log.append([{"id": f"i{k}", "text": "x" * (k % 7), **({"finish_reason": "error"} if k % 10 == 0 else {})}
                for k in range(n)])
    log.commit()
    view = FinishedResults(log.path)
    assert len(view) == n and view.failed == log.failed and not hasattr(view, "ids")
    assert len(view.sparse) == 3
    r = random.Random(0)
    for offset in [0, 1, STRIDE - 1, STRIDE, STRIDE + 1, n - 1, n, n + 5, *(r.randrange(n) for _ in range(20))]:
        limit = r.randint(1, 3 * STRIDE)
        assert view.read(offset, limit) == log.read(offset, limit), offset
        assert view.read(offset, limit, max_bytes=300) == log.read(offset, limit, max_bytes=300), offset
    assert view.append([{"id": "i3"}, {"id": "i9"}]) == (0, 2) and "i5" in view
    log.close()
