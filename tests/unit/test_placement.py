from shoal.scheduler.placement import PendingSeq, WorkerLoad, place


def seqs(n, kv=100):
    return [PendingSeq(i, kv) for i in range(n)]


def test_spreads_evenly_over_equal_workers():
    placed, left = place(seqs(10), [WorkerLoad("a", 10_000, 0, 100), WorkerLoad("b", 10_000, 0, 100)])
    assert len(placed["a"]) == len(placed["b"]) == 5 and not left


def test_faster_worker_gets_proportionally_more():
    placed, _ = place(seqs(30), [WorkerLoad("slow", 10**6, 0, 100, speed=1.0), WorkerLoad("fast", 10**6, 0, 100, speed=2.0)])
    assert len(placed["fast"]) == 20 and len(placed["slow"]) == 10


def test_respects_queue_bound_and_kv_and_keeps_order_of_leftovers():
    workers = [WorkerLoad("a", 250, 0, 100), WorkerLoad("b", 10_000, 9, 10)]
    placed, left = place(seqs(5), workers)
    assert placed == {"a": [0, 1], "b": [2]}  # a (less loaded) until its KV is full; b has one slot
    assert [s.seq_id for s in left] == [3, 4]


def test_existing_load_counts():
    placed, _ = place(seqs(4), [WorkerLoad("busy", 10**6, 6, 100), WorkerLoad("idle", 10**6, 0, 100)])
    assert placed == {"idle": [0, 1, 2, 3]}


def test_a_sequence_too_big_for_every_worker_stays_pending():
    placed, left = place([PendingSeq("huge", 10**9)], [WorkerLoad("a", 1000, 0, 10)])
    assert placed == {} and [s.seq_id for s in left] == ["huge"]
