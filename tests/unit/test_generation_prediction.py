"""A generation job's predicted time (`scheduler/generation_prediction.py`): the planners
the engines run, on a virtual clock, charged by the calibration."""

from __future__ import annotations

import pytest

from shoal.scheduler.cost_model import CostModel
from shoal.scheduler.generation_prediction import WorkerShape, predict_generation

COST = CostModel(alpha_p=0.01, beta_p=0.001, alpha_d=0.02, beta_d=0.0005, mb_a=0.001, mb_b=0.0, mb_c=0.0)


def shape(policy="mb", budget=100_000, max_seqs=256):
    return WorkerShape(COST, policy, budget, max_seqs, kv_tokens=1_000_000, block_size=16)


def test_one_prefill_step_then_decode_steps_cost_what_the_calibration_says():
    n, prompt, out = 32, 100, 20
    p = predict_generation([(prompt, out)] * n, [shape()])
    want = COST.prefill_time(n * prompt) + (out - 1) * COST.decode_time(n)
    assert p.steps == out and p.seconds == pytest.approx(want)
    assert p.output_tokens == n * out and not p.upper_bound


def test_two_workers_split_the_job_and_it_takes_its_slowest_worker():
    lengths = [(50, 10)] * 40
    one, two = predict_generation(lengths, [shape()]), predict_generation(lengths, [shape(), shape()])
    half = predict_generation(lengths[:20], [shape()])
    assert two.seconds == pytest.approx(half.seconds) and two.seconds < one.seconds and two.workers == 2


def test_an_items_samples_run_on_one_worker():
    """Eight items of n=4 on two workers: four items (16 sequences) each, never a split item."""
    lengths = [(40 + i, 12) for i in range(8) for _ in range(4)]
    two = predict_generation(lengths, [shape(), shape()], per_item=[4] * 8)
    alone = predict_generation([x for i in range(1, 8, 2) for x in lengths[4 * i:4 * i + 4]], [shape()])  # the slower share
    assert two.seconds == pytest.approx(alone.seconds) and two.output_tokens == 32 * 12
    # Two items of n=4 on two workers: one each, so as long as one item alone.
    pair = predict_generation(lengths[:8], [shape(), shape()], per_item=[4, 4])
    assert pair.seconds == pytest.approx(predict_generation(lengths[4:8], [shape()]).seconds)  # the slower item
    with pytest.raises(ValueError, match="per_item counts 7"):
        predict_generation(lengths[:8], [shape()], per_item=[4, 3])


@pytest.mark.parametrize("policy", ["mb", "eb", "ebplus"])
def test_every_policy_finishes_every_token_within_its_budget(policy):
    lengths = [(30 + 7 * (i % 11), 5 + i % 13) for i in range(300)]
    p = predict_generation(lengths, [shape(policy, budget=512, max_seqs=64)], upper_bound=True)
    assert p.output_tokens == sum(o for _, o in lengths) and p.upper_bound and "at most" in p.summary()
    # No step takes more than the budget's prefill plus a full batch of decodes.
    assert p.seconds >= sum(p_ for p_, _ in lengths) * COST.beta_p and p.steps >= max(o for _, o in lengths)


def test_a_worker_without_a_calibration_is_named_missing():
    info = {"calibration": None, "policy": "mb", "budget": 512, "max_seqs": 8, "kv_tokens": 4096, "block_size": 16}
    with pytest.raises(KeyError, match="calibration"):
        WorkerShape.from_info(info)
    info["calibration"] = COST.to_dict()
    assert WorkerShape.from_info(info).budget == 512
