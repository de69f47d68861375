"""The formulas of exclusive batching (EB) and the EB–MB crossover (EB+).

Pure functions of the cost model and the output-length hazard. Notation: N sequences
decode until k finish, then k new ones are prefilled; θ = k/N; p the per-step finish
probability (constant hazard) or p₀ + η·t (increasing hazard).
"""

from __future__ import annotations

import math

from shoal.scheduler.cost_model import CostModel

THETA_MIN, THETA_MAX = 0.01, 0.80
# The least decode-step overhead the formulas divide by. A calibration fit of a small
# model can put α_d at 0 (the non-negative line fit clips it); no real step is free, and
# a microsecond keeps θ* and ρ finite while sending them to their limits, which the
# callers clamp (θ* → THETA_MAX, the hazard correction → its cap).
ALPHA_D_FLOOR = 1e-6


def _alpha_d(cm: CostModel) -> float:
    return max(cm.alpha_d, ALPHA_D_FLOOR)


def tau(j: int, p: float, cm: CostModel) -> float:
    """Expected time until the first of j decoding sequences finishes."""
    return cm.decode_time(j) / (1.0 - (1.0 - p) ** j)


def exact_threshold(n: int, p: float, cm: CostModel) -> int:
    """Prop. 1: the smallest k with k·τ(N−k) − Σ_{j=N−k+1..N} τ(j) ≥ α_p (N if none)."""
    tail = 0.0  # Σ τ(j) for j in (N−k, N]
    for k in range(1, n):
        tail += tau(n - k + 1, p, cm)
        if k * tau(n - k, p, cm) - tail >= cm.alpha_p:
            return k
    return n


def _theta_equation(theta: float) -> float:
    return theta / (1.0 - theta) + math.log1p(-theta)


def asymptotic_threshold(p: float, cm: CostModel) -> float:
    """θ* solving θ/(1−θ) + ln(1−θ) = p·α_p/α_d (bisection; the left side increases)."""
    target = p * cm.alpha_p / _alpha_d(cm)
    lo, hi = 0.0, 1.0 - 1e-12
    for _ in range(200):
        mid = (lo + hi) / 2
        if _theta_equation(mid) < target:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def hazard_rate(p0: float) -> float:
    """p for the exact constant-hazard form: −ln(1−p₀)."""
    return -math.log1p(-p0)


def increasing_hazard_correction(theta0: float, p0: float, eta: float, n: int, cm: CostModel) -> float:
    """Thm. 2: Δθ for h(t) = p₀ + η·t, capped at 5·θ₀ as the reference code does."""
    if eta <= 0:
        return 0.0
    lam = -math.log1p(-theta0)
    rho = cm.beta_d * n / _alpha_d(cm)
    delta = eta * (1 - theta0) ** 2 / (p0 * p0 * theta0) * (lam * (theta0 / (1 - theta0) - lam / 2) + rho * (lam - theta0))
    return max(-theta0 / 2, min(delta, 5 * theta0))


def clamp_theta(theta: float) -> float:
    return min(THETA_MAX, max(THETA_MIN, theta))


def memory_safe_batch(capacity_tokens: int, theta: float, p0: float, mean_prompt: float, eps: float = 0.01) -> int:
    """Prop. 3: N̂* = ⌊(C − ν·ln(1/ε)) / D(θ)⌋, ν = 1/(p₀²·μ_L),
    D(θ) = μ_L + (1−θ)/(θ·p₀)·ln(1/(1−θ)): the expected KV tokens per sequence."""
    nu = 1.0 / (p0 * p0 * max(mean_prompt, 1.0))
    d = mean_prompt + (1 - theta) / (theta * p0) * math.log(1.0 / (1.0 - theta))
    return max(1, int((capacity_tokens - nu * math.log(1.0 / eps)) // d))


def crossover(cm: CostModel, mean_prompt: float, mean_output: float, theta0: float, k: int, n: int) -> tuple[float, float]:
    """Prop. 4: (LHS, RHS); EB is better when LHS > RHS.
    LHS = β_MB(r) − β_EB with r the decode share and β_EB the pure modes' blended cost;
    RHS = [(α_p − α_d·ln(1−θ₀)·μ_O)/k − α_MB·(1+μ_O)/N] / (μ_L+μ_O), α_MB ≈ α_p."""
    total = mean_prompt + mean_output
    r = mean_output / total
    beta_eb = (cm.beta_p * mean_prompt + cm.beta_d * mean_output) / total
    lhs = cm.beta_mb(r) - beta_eb
    rhs = ((cm.alpha_p - cm.alpha_d * math.log1p(-theta0) * mean_output) / max(k, 1) - cm.alpha_p * (1 + mean_output) / n) / total
    return lhs, rhs
