"""Work stealing and draining policies."""

from __future__ import annotations

from shoal.scheduler.rebalance import Move, plan_drain, plan_steals


def test_an_idle_worker_steals_half_the_gap_once_nothing_is_pending():
    held, cap = {"w0": 40, "w1": 0}, {"w0": 64, "w1": 64}
    assert plan_steals(held, cap, pending=3) == []  # pending items go to the idle worker first
    assert plan_steals(held, cap, pending=0) == [Move("w0", "w1", 20)]
    # After the move the gap is gone: nothing moves back.
    assert plan_steals({"w0": 20, "w1": 20}, cap, pending=0) == []
    assert plan_steals({"w0": 21, "w1": 19}, cap, pending=0) == []


def test_steals_pair_the_most_and_least_loaded_and_respect_room_and_moves_under_way():
    held = {"w0": 60, "w1": 10, "w2": 0, "w3": 30}
    cap = {w: 32 for w in held}
    assert plan_steals(held, cap, 0) == [Move("w0", "w2", 30), Move("w3", "w1", 10)]
    assert plan_steals(held, cap, 0, busy={"w2"}) == [Move("w0", "w1", 22)]
    assert plan_steals({"w0": 60, "w1": 30}, {"w0": 64, "w1": 32}, 0) == [Move("w0", "w1", 2)]


def test_steals_even_out_time_left_not_counts_when_speeds_differ():
    cap = {"fast": 512, "slow": 512}
    speed = {"fast": 2.0, "slow": 1.0}
    # A fast card holding twice the slow one's count has the same time left: nothing
    # moves (by count, 100 sequences would have gone to the slow card).
    assert plan_steals({"fast": 300, "slow": 150}, cap, 0, speed=speed) == []
    # The slow card behind: it gives the fast one what leaves both with the same time,
    # (150 - c) / 1 = (0 + c) / 2.
    assert plan_steals({"fast": 0, "slow": 150}, cap, 0, speed=speed) == [Move("slow", "fast", 100)]
    # The fast card far behind gets work from the slow one only down to equal times.
    assert plan_steals({"fast": 100, "slow": 150}, cap, 0, speed=speed) == [Move("slow", "fast", 66)]
    # A worker without a calibration counts as the mean of the others; equal speeds are
    # the counts' half-gap rule.
    assert plan_steals({"a": 30, "b": 30, "c": 0}, {w: 64 for w in "abc"}, 0, speed={"a": 1.0, "b": 3.0}) == \
        [Move("a", "c", 20)]  # (30 - 20) / 1 = 20 / 2
    assert plan_steals({"w0": 40, "w1": 0}, {"w0": 64, "w1": 64}, 0, speed={"w0": 5.0, "w1": 5.0}) == \
        [Move("w0", "w1", 20)]


def test_a_drain_spreads_by_free_room_and_waits_when_there_is_none():
    held, cap = {"w0": 50, "w1": 10, "w2": 30}, {"w0": 64, "w1": 64, "w2": 64}
    assert plan_drain("w0", held, cap, holding=50) == [Move("w0", "w1", 50)]
    assert plan_drain("w0", held, cap, holding=70) == [Move("w0", "w1", 54), Move("w0", "w2", 16)]
    assert plan_drain("w0", {"w0": 5, "w1": 64}, cap, holding=5) == []
    assert plan_drain("w0", held, cap, holding=5, exclude={"w1"}) == [Move("w0", "w2", 5)]
