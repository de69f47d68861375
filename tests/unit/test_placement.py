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


def test_a_max_tokens_past_the_context_is_placed_at_what_the_worker_can_run():
    """max_tokens of 1e9 once kept an item pending forever (its KV need fit nowhere);
    the engine stops a sequence at its context, so that is all it needs."""
    from shoal.scheduler.placement import PendingSeq, WorkerLoad, place

    w = WorkerLoad("w0", free_kv_tokens=4096, held=0, max_held=8, max_seq_tokens=2048)
    placed, left = place([PendingSeq("huge", 1_000_000_003), PendingSeq("a", 1000), PendingSeq("b", 1100)], [w])
    assert placed == {"w0": ["huge", "a"]} and [p.seq_id for p in left] == ["b"]
    # A worker that publishes no context is bounded by its whole cache.
    placed, _ = place([PendingSeq("huge", 1_000_000_003)], [WorkerLoad("old", 4096, 0, 8)])
    assert placed == {"old": ["huge"]}
