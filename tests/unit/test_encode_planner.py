from shoal.scheduler.cost_model import CostModel
from shoal.scheduler.embed_prediction import EncoderCost
from shoal.scheduler.encode_planner import plan_encode

COST = EncoderCost(a=2e-3, c=1e-5, t_call=0.0)


def test_idle_engine_or_no_calibration_encodes_everything():
    assert plan_encode([30] * 500, 0.0, COST, 2048) == 500
    assert plan_encode([30] * 500, 0.01, None, 2048) == 500
    assert plan_encode([], 0.01, COST, 2048) == 0


def test_a_backlog_is_spread_over_steps_within_the_engine_steps_time():
    lengths = [40] * 1000
    take = plan_encode(lengths, 0.02, COST, 2048)
    assert 1 <= take < 1000
    assert COST.encode(lengths[:take], 2048) <= 0.02 < COST.encode(lengths[:take + 1], 2048)
    assert plan_encode(lengths, 0.04, COST, 2048) > take  # a longer step leaves room for more
    assert plan_encode([4000], 1e-6, COST, 2048) == 1  # always progress


def test_engine_step_time_from_the_cost_model():
    cm = CostModel(1e-3, 2e-5, 8e-3, 5e-5, 2e-5, 5e-5, 1e-5)
    assert cm.step_time(0, 0) == 0.0
    assert cm.step_time(0, 32) == 8e-3 + 32 * 5e-5
    assert cm.step_time(256, 0) == 1e-3 + 256 * 2e-5
    assert cm.step_time(100, 10) == 8e-3 + 100 * 2e-5 + 10 * 5e-5


def test_a_few_short_texts_wait_to_amortize_the_call_while_the_engine_is_busy():
    cost = EncoderCost(a=10e-3, c=0.1e-3, t_call=0.0)  # a query of 20 tokens: 2 ms beside a 10 ms overhead
    assert plan_encode([20, 20], 0.005, cost, 2048) == 0  # deferred
    assert plan_encode([20, 20], 0.005, cost, 2048, oldest_wait_steps=4) == 2  # waited long enough
    assert plan_encode([20] * 5, 0.005, cost, 2048) >= 5  # an amortizing batch goes at once
    assert plan_encode([20, 20], 0.0, cost, 2048) == 2  # the engine is idle: nobody to stall
