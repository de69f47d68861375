"""The default step budget read off the calibration's budget probe, and the prefill fit
whose intercept may not go below zero."""

import pytest

from shoal.scheduler.cost_model import CostModel
from shoal.scheduler.least_squares import fit_line_nonnegative


def model(probe):
    return CostModel(1e-3, 1e-5, 1e-3, 1e-5, 1e-5, 0.0, 0.0, budget_probe=probe)


def test_largest_budget_within_ten_percent_of_the_best():
    # tokens/s: 1000, 1600, 1900, 2000, 1850, 1200
    probe = [[128, 0.128], [256, 0.16], [512, 512 / 1900], [1024, 0.512], [2048, 2048 / 1850], [4096, 4096 / 1200]]
    assert model(probe).step_budget() == 2048
    assert model(probe).step_budget(share=0.99) == 1024
    assert model(probe).step_budget(share=0.5) == 4096


def test_no_probe_no_budget():
    assert model([]).step_budget() is None
    assert model([[0, 0.0]]).step_budget() is None


def test_probe_survives_serialization():
    cm = model([[256, 0.1], [512, 0.15]])
    again = CostModel.from_dict(cm.to_dict())
    assert again.step_budget() == cm.step_budget() == 512


def test_line_fit_keeps_a_nonnegative_intercept():
    xs = [64, 128, 256, 512]
    (a, b), r2 = fit_line_nonnegative(xs, [0.002 + 1e-4 * x for x in xs])
    assert a == pytest.approx(0.002) and b == pytest.approx(1e-4) and r2 == pytest.approx(1.0)
    superlinear = [1e-4 * x + 1e-7 * x * x for x in xs]  # a free line would cross below 0
    (a, b), r2 = fit_line_nonnegative(xs, superlinear)
    assert a == 0.0 and b > 1e-4 and 0.9 < r2 < 1.0
