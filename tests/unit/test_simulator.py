"""The simulator, driving the real planners, reproduces the direction of the EB paper's
results with its published Qwen3-8B calibrations (EB+)."""

from __future__ import annotations

import pytest

from shoal.scheduler.adaptive_planner import AdaptivePlanner
from shoal.scheduler.cost_model import H200_QWEN3_8B, RTX6000_QWEN3_8B
from shoal.scheduler.exclusive_planner import ExclusiveBatchPlanner
from shoal.scheduler.sim.simulator import StepTimeModel, simulate
from shoal.scheduler.step_planner import MixedBatchPlanner, PlannerConfig
from shoal.scheduler.sim.traces import cell, distribution_shift

BLOCKS = 40_000
CFG = PlannerConfig(block_size=16, max_num_batched_tokens=8192, max_num_seqs=256, num_blocks=BLOCKS)


def run_all(cm, r_star, phases):
    tm = StepTimeModel(cm, r_star)
    out = {}
    for name, planner in (("mb", MixedBatchPlanner(CFG)), ("eb", ExclusiveBatchPlanner(CFG, cm)),
                          ("ebplus", AdaptivePlanner(CFG, cm))):
        out[name] = simulate(planner, tm, phases, BLOCKS)
    return out


def test_interference_matches_the_papers_crossover_shares():
    for cm, r_star in ((H200_QWEN3_8B, 0.8), (RTX6000_QWEN3_8B, 0.2)):
        tm = StepTimeModel(cm, r_star)
        for r, above in ((r_star - 0.05, False), (r_star + 0.05, True)):
            d = 1000
            p = int(d * (1 - r) / r)
            marginal = (tm.step_time(p, d) - max(cm.alpha_p, cm.alpha_d)) / (p + d)
            assert (marginal > cm.beta_d) == above


@pytest.mark.parametrize("r_star", [0.15, 0.2, 0.3])
def test_rtx_decode_heavy_eb_beats_mb_over_a_range_of_interference(r_star):
    res = run_all(RTX6000_QWEN3_8B, r_star, cell("decode-heavy", 500, 128))
    tput = {k: v.steady_throughput for k, v in res.items()}
    assert tput["eb"] > 1.02 * tput["mb"]
    assert tput["ebplus"] >= 0.98 * max(tput["eb"], tput["mb"])
    assert "eb" in res["ebplus"].mode_time  # it did switch, not pass by staying in MB


@pytest.mark.parametrize("r_star", [0.7, 0.8, 0.9])
def test_h200_modes_within_a_few_percent(r_star):
    res = run_all(H200_QWEN3_8B, r_star, cell("balanced", 500, 128))
    tput = {k: v.steady_throughput for k, v in res.items()}
    assert 0.96 < tput["eb"] / tput["mb"] < 1.04
    assert tput["ebplus"] >= 0.98 * max(tput["eb"], tput["mb"])


def test_ebplus_beats_mb_under_distribution_shift():
    res = run_all(RTX6000_QWEN3_8B, 0.2, distribution_shift(300, 128))
    assert res["ebplus"].throughput > 1.05 * res["mb"].throughput
    assert res["ebplus"].throughput >= 0.98 * max(res["eb"].throughput, res["mb"].throughput)
