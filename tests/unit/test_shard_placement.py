import pytest

from shoal.scheduler.shard_placement import PlacementError, place_shards


def test_each_shard_on_distinct_nodes_spread_evenly():
    p = place_shards(4, ["s0", "s1", "s2"], replicas=2)
    assert all(len(set(nodes)) == 2 for nodes in p)
    counts = {n: sum(n in nodes for nodes in p) for n in ("s0", "s1", "s2")}
    assert max(counts.values()) - min(counts.values()) <= 1
    assert p == place_shards(4, ["s2", "s0", "s1"], replicas=2)  # deterministic


def test_held_shards_stay_and_load_steers_the_rest():
    p = place_shards(2, ["s0", "s1", "s2"], replicas=1, load={"s0": 5}, held={1: {"s0"}})
    assert p == [["s1"], ["s0"]]


def test_too_many_replicas_is_refused_by_name():
    with pytest.raises(PlacementError, match="3 replicas need 3 storage nodes; the cluster has 2"):
        place_shards(1, ["s0", "s1"], replicas=3)
