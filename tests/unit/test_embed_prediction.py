"""The embedding cost model's predictions: SuperBatches pay off exactly when call
overhead is a large share of per-partition time (φ), and never cost more than calls
they save; the time of a job is the sum of its calls and micro-batches."""

from __future__ import annotations

import random

import pytest

from shoal.scheduler.embed_prediction import EncoderCost, predict


def corpus(partitions: int, sigma: float, seed: int = 0) -> dict[str, list[int]]:
    r = random.Random(seed)
    return {f"p{i}": [r.randint(5, 60) for _ in range(max(1, int(r.lognormvariate(1.5, sigma))))]
            for i in range(partitions)}


def test_time_is_calls_plus_micro_batches():
    cost = EncoderCost(a=0.01, c=1e-4, t_call=0.5, overlap=False)
    p = predict({"x": [10, 10, 20], "y": [20]}, b_min=4, n_max=4, cost=cost, token_budget=100)
    # One SuperBatch of 4 texts sorted [10, 10, 20, 20]: 4 × 20 = 80 padded tokens fit one micro-batch.
    assert p.superbatches == 1 and p.superbatch_s == pytest.approx(0.5 + 0.01 + 1e-4 * 80)
    # Per partition: x as [10, 10, 20] (3 × 20 = 60), y alone (20): two calls.
    assert p.per_partition_s == pytest.approx(2 * 0.5 + 0.02 + 1e-4 * 80)
    assert p.phi == pytest.approx(1 - 1e-4 * 80 / p.per_partition_s)  # calls and micro-batch overheads
    # Overlapped (two calls in flight): a call costs the larger of its overhead and its encoding.
    fast_calls = EncoderCost(a=0.01, c=1e-4, t_call=0.015)
    p = predict({"x": [10, 10, 20], "y": [20]}, b_min=4, n_max=4, cost=fast_calls, token_budget=100)
    assert p.superbatch_s == pytest.approx(0.018) and p.per_partition_s == pytest.approx(0.016 + 0.015)


def test_gain_follows_phi():
    many_small = corpus(2000, 1.0)
    cheap_calls = predict(many_small, 512, 512, EncoderCost(0.0002, 2e-5, t_call=1e-5, overlap=False))
    costly_calls = predict(many_small, 512, 512, EncoderCost(0.0002, 2e-5, t_call=0.02, overlap=False))
    assert cheap_calls.phi < 0.05 and costly_calls.phi > 0.5
    assert costly_calls.gain > 2.0 and costly_calls.gain > cheap_calls.gain
    for p in (cheap_calls, costly_calls):  # fixed costs removed, and less padding
        assert p.padding > 1.0 and p.gain <= 1.0001 * p.padding / (1 - p.phi)
    assert "pays off" in costly_calls.summary()


def test_cv_grows_with_sigma_and_empty_partitions_cost_no_call():
    assert predict(corpus(500, 2.5), 64, 64, EncoderCost(0, 1e-5, 0.01)).cv > \
        predict(corpus(500, 1.0), 64, 64, EncoderCost(0, 1e-5, 0.01)).cv
    p = predict({"a": [5] * 3, "empty": [], "b": [5] * 3}, 10, 10, EncoderCost(0.0, 0.0, 1.0, overlap=False))
    assert p.per_partition_s == pytest.approx(2.0) and p.superbatch_s == pytest.approx(1.0)
