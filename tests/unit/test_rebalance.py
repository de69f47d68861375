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


def test_a_drain_spreads_by_free_room_and_waits_when_there_is_none():
    held, cap = {"w0": 50, "w1": 10, "w2": 30}, {"w0": 64, "w1": 64, "w2": 64}
    assert plan_drain("w0", held, cap, holding=50) == [Move("w0", "w1", 50)]
    assert plan_drain("w0", held, cap, holding=70) == [Move("w0", "w1", 54), Move("w0", "w2", 16)]
    assert plan_drain("w0", {"w0": 5, "w1": 64}, cap, holding=5) == []
    assert plan_drain("w0", held, cap, holding=5, exclude={"w1"}) == [Move("w0", "w2", 5)]
