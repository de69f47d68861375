from shoal.scheduler.step_planner import MixedBatchPlanner, PlannerConfig, SeqView


def planner(**kw):
    return MixedBatchPlanner(PlannerConfig(block_size=4, **kw))


def decode(i, n):  # n tokens, n-1 computed, holding enough blocks for n-1
    return SeqView(i, n, n - 1, -(-(n - 1) // 4))


def test_decodes_then_prefill_chunks_under_token_budget():
    p = planner(max_num_batched_tokens=10)
    plan = p.plan([decode("a", 9), decode("b", 5)], [SeqView("c", 20, 0, 0), SeqView("d", 3, 0, 0)], free_blocks=100)
    assert plan.chunks == [("a", 1), ("b", 1), ("c", 8)]
    assert plan.num_tokens == 10 and not plan.preempted


def test_without_chunking_whole_prompts_only():
    p = planner(max_num_batched_tokens=10, chunked_prefill=False)
    plan = p.plan([decode("a", 9)], [SeqView("c", 20, 0, 0), SeqView("d", 3, 0, 0)], free_blocks=100)
    assert plan.chunks == [("a", 1)]
    # An oversized prompt still runs alone, or it would starve.
    plan = p.plan([], [SeqView("c", 20, 0, 0)], free_blocks=100)
    assert plan.chunks == [("c", 20)]


def test_partial_prefill_continues_from_computed():
    plan = planner(max_num_batched_tokens=6).plan([SeqView("a", 20, 8, 2)], [], free_blocks=10)
    assert plan.chunks == [("a", 6)]


def test_preempts_newest_when_blocks_run_out():
    # Both need a new block (9th and 5th token start a block); one is free.
    plan = planner().plan([decode("old", 9), decode("new", 5)], [], free_blocks=1)
    assert plan.chunks == [("old", 1)] and plan.preempted == ["new"]


def test_preempts_itself_when_alone_and_no_room():
    plan = planner().plan([decode("a", 9)], [SeqView("w", 4, 0, 0)], free_blocks=0)
    assert plan.chunks == [] and plan.preempted == ["a"]


def test_no_admission_in_a_step_that_preempts():
    plan = planner().plan([decode("a", 9), decode("b", 9)], [SeqView("w", 2, 0, 0)], free_blocks=1)
    assert plan.preempted == ["b"] and [c[0] for c in plan.chunks] == ["a"]


def test_admission_respects_blocks_and_max_seqs():
    p = planner(max_num_seqs=2)
    plan = p.plan([decode("a", 3)], [SeqView("w1", 4, 0, 0), SeqView("w2", 4, 0, 0)], free_blocks=10)
    assert [c[0] for c in plan.chunks] == ["a", "w1"]
    plan = planner().plan([], [SeqView("w1", 8, 0, 0), SeqView("w2", 8, 0, 0)], free_blocks=3)
    assert plan.chunks == [("w1", 8)]  # w2 would need 2 more blocks than are left


def test_cached_prefix_counts_toward_computed_and_free_cost():
    # 8 of 10 tokens cached in 2 blocks; one of those sits in the free list.
    v = SeqView("w", 10, 8, 2, cached_free_blocks=1)
    plan = planner().plan([], [v], free_blocks=2)
    assert plan.chunks == [("w", 2)]  # needs 1 (cached, free) + 1 (third block)
    assert planner().plan([], [v], free_blocks=1).chunks == []
