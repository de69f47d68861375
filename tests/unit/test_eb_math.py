"""EB formulas against values computed independently here."""

import math

import pytest

from shoal.scheduler import eb_math
from shoal.scheduler.cost_model import H200_QWEN3_8B, RTX6000_QWEN3_8B, CalibrationError, CostModel


def test_asymptotic_threshold_h200_near_0_0117():
    p = eb_math.hazard_rate(4.75e-4)
    theta = eb_math.asymptotic_threshold(p, H200_QWEN3_8B)
    assert theta == pytest.approx(0.0117, abs=2e-4)
    # Small-θ approximation √(2pα_p/α_d).
    assert theta == pytest.approx(math.sqrt(2 * p * 1.28e-3 / 8.92e-3), rel=0.02)


def test_asymptotic_threshold_solves_its_equation():
    for cm in (H200_QWEN3_8B, RTX6000_QWEN3_8B):
        for p in (1e-4, 1e-3, 1e-2, 0.1):
            th = eb_math.asymptotic_threshold(p, cm)
            assert th / (1 - th) + math.log(1 - th) == pytest.approx(p * cm.alpha_p / cm.alpha_d, rel=1e-9)


def brute_force_k(n, p, cm):
    t = lambda j: (cm.alpha_d + cm.beta_d * j) / (1 - (1 - p) ** j)
    for k in range(1, n):
        if k * t(n - k) - sum(t(j) for j in range(n - k + 1, n + 1)) >= cm.alpha_p:
            return k
    return n


@pytest.mark.parametrize("n, p0", [(64, 1 / 512), (256, 1 / 512), (1024, 1 / 512), (256, 4.75e-4), (1024, 1e-4)])
def test_exact_threshold_matches_brute_force(n, p0):
    p = eb_math.hazard_rate(p0)
    assert eb_math.exact_threshold(n, p, H200_QWEN3_8B) == brute_force_k(n, p, H200_QWEN3_8B)


@pytest.mark.parametrize("n, p0", [(256, 4.75e-4), (1024, 1e-4)])
def test_exact_threshold_approaches_asymptote_while_p_n_is_small(n, p0):
    # The asymptotic form drops β_d, which cancels only while p·N and β_d·N/α_d are small;
    # beyond that the exact k* grows (each extra sequence slows every decode step).
    p = eb_math.hazard_rate(p0)
    k = eb_math.exact_threshold(n, p, H200_QWEN3_8B)
    assert k / n == pytest.approx(eb_math.asymptotic_threshold(p, H200_QWEN3_8B), abs=2.5 / n + 0.002)


def test_increasing_hazard_moves_threshold_and_is_capped():
    th0 = 0.02
    d = eb_math.increasing_hazard_correction(th0, 1e-3, 1e-7, 256, H200_QWEN3_8B)
    assert d > 0
    assert eb_math.increasing_hazard_correction(th0, 1e-3, 1.0, 256, H200_QWEN3_8B) == pytest.approx(5 * th0)
    assert eb_math.increasing_hazard_correction(th0, 1e-3, 0.0, 256, H200_QWEN3_8B) == 0.0


def test_zero_decode_overhead_sends_theta_to_its_limit():
    # A calibration fit on a small model can clip α_d to 0; the planner must still build.
    from dataclasses import replace

    from shoal.scheduler.exclusive_planner import ExclusiveBatchPlanner
    from shoal.scheduler.step_planner import PlannerConfig

    free = replace(H200_QWEN3_8B, alpha_d=0.0)
    p = eb_math.hazard_rate(4e-3)
    theta = eb_math.asymptotic_threshold(p, free)
    assert theta > eb_math.asymptotic_threshold(p, H200_QWEN3_8B)
    assert eb_math.clamp_theta(theta) == eb_math.THETA_MAX
    d = eb_math.increasing_hazard_correction(0.02, 1e-3, 1e-7, 256, free)
    assert d == pytest.approx(5 * 0.02)
    planner = ExclusiveBatchPlanner(PlannerConfig(block_size=16, num_blocks=4096), free)
    assert eb_math.THETA_MIN <= planner.theta <= eb_math.THETA_MAX and planner.k_hat >= 1


def test_memory_safe_batch_by_hand():
    C, th, p0, mu = 200_000, 0.05, 1 / 512, 512
    nu = 1 / (p0 * p0 * mu)
    D = mu + (1 - th) / (th * p0) * math.log(1 / (1 - th))
    assert eb_math.memory_safe_batch(C, th, p0, mu) == int((C - nu * math.log(100)) // D)
    assert eb_math.memory_safe_batch(C, th, p0, mu) < C / mu


def test_crossover_by_hand_and_direction():
    cm = RTX6000_QWEN3_8B
    lhs, rhs = eb_math.crossover(cm, 128, 1024, 0.05, 25, 512)
    r = 1024 / 1152
    want_lhs = cm.beta_mb(r) - (cm.beta_p * 128 + cm.beta_d * 1024) / 1152
    want_rhs = ((cm.alpha_p - cm.alpha_d * math.log(1 - 0.05) * 1024) / 25 - cm.alpha_p * 1025 / 512) / 1152
    assert (lhs, rhs) == pytest.approx((want_lhs, want_rhs))
    # Decode-heavy on the bandwidth-poor card: EB side.
    assert lhs > rhs


def test_cost_model_validation():
    H200_QWEN3_8B.validate()
    with pytest.raises(CalibrationError, match="negative"):
        CostModel(-1e-3, 1e-5, 1e-3, 1e-5, 1e-5, 1e-5, 0).validate()
    with pytest.raises(CalibrationError, match="R² 0.500"):
        CostModel(1e-3, 1e-5, 1e-3, 1e-5, 1e-5, 1e-5, 0, r2={"decode": 0.5}).validate()
    with pytest.raises(CalibrationError, match="for model 'a'"):
        CostModel(1e-3, 1e-5, 1e-3, 1e-5, 1e-5, 1e-5, 0, model="a").validate(model="b")
    assert CostModel.from_dict(H200_QWEN3_8B.to_dict()) == H200_QWEN3_8B
