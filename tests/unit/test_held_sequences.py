"""The worker's table of held sequences: a re-sent assignment is taken once, what is
stored or moved is released, and a new leader is told the rest by job."""

from shoal.nodes.worker.held_sequences import HeldSequences


def test_taken_once_released_and_listed_by_job():
    held = HeldSequences()
    assert [s["seq_id"] for s in held.take("j", [{"seq_id": 2}, {"seq_id": "a"}])] == [2, "a"]
    assert held.take("j", [{"seq_id": 2}, {"seq_id": 3}]) == [{"seq_id": 3}]  # 2 is a re-send
    assert held.holds("j", 3) and not held.holds("k", 3)
    held.release("j", [2, 3])
    held.take("k", [{"seq_id": 1}])
    assert held.by_job() == {"j": ["a"], "k": [1]}
    held.release("j", ["a"])
    assert held.by_job() == {"k": [1]} and held.any()
    held.clear()
    assert not held.any() and held.by_job() == {}


def test_keep_only_lets_go_of_the_rest():
    held = HeldSequences()
    held.take("j", [{"seq_id": 1}, {"seq_id": 2}, {"seq_id": 3}])
    held.take("k", [{"seq_id": 1}])
    assert held.keep_only({"j": {2, 3, 9}, "x": {1}}) == 2  # 9: not held, not added
    assert held.by_job() == {"j": [2, 3]} and not held.holds("k", 1)
    assert held.keep_only({}) == 0 and not held.any()
