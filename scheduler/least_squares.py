"""Small least-squares fits with R², for calibration (numpy only)."""

from __future__ import annotations

import numpy as np


def fit_polynomial(x, y, degree: int, weights=None) -> tuple[list[float], float]:
    """Coefficients (constant first) of the least-squares polynomial, and its R²."""
    x = np.asarray(x, dtype=float)
    y = np.asarray(y, dtype=float)
    if len(x) < degree + 1:
        raise ValueError(f"need at least {degree + 1} points to fit degree {degree}, got {len(x)}")
    X = np.vander(x, degree + 1, increasing=True)
    w = np.ones_like(y) if weights is None else np.asarray(weights, dtype=float)
    sw = np.sqrt(w)
    coef, *_ = np.linalg.lstsq(X * sw[:, None], y * sw, rcond=None)
    pred = X @ coef
    ss_res = float(np.sum(w * (y - pred) ** 2))
    mean = float(np.sum(w * y) / np.sum(w))
    ss_tot = float(np.sum(w * (y - mean) ** 2))
    r2 = 1.0 - ss_res / ss_tot if ss_tot > 0 else (1.0 if ss_res == 0 else 0.0)
    return [float(c) for c in coef], r2


def fit_line_nonnegative(x, y) -> tuple[list[float], float]:
    """The least-squares line `a + b·x` with `a >= 0`, and its R². Where the free fit's
    intercept is negative (a cost that grows faster than linearly, such as attention
    over a longer prompt) the constrained optimum lies on a = 0: the line through the
    origin."""
    (a, b), r2 = fit_polynomial(x, y, 1)
    if a >= 0:
        return [a, b], r2
    x = np.asarray(x, dtype=float)
    y = np.asarray(y, dtype=float)
    b = float(np.dot(x, y) / np.dot(x, x))
    ss_res = float(np.sum((y - b * x) ** 2))
    ss_tot = float(np.sum((y - y.mean()) ** 2))
    return [0.0, b], (1.0 - ss_res / ss_tot if ss_tot > 0 else 0.0)


def fit_measured(measure, fit, repeats: int, floor: float) -> tuple[list[float], float]:
    """`fit(*measure(repeats))`, where `measure(n)` returns fresh (x, y) points from n
    timings each; a fit whose R² falls below `floor` is measured once more with twice the
    repeats and the better of the two kept. On a CPU shared with other processes a few
    slow steps, not the model, usually sink a calibration's fit (W1's model on a 2-core
    Xeon: prefill R² 0.894 in one calibration, 0.97 in the next three), and a refused
    calibration costs the worker EB+ until it is measured again."""
    params, r2 = fit(*measure(repeats))
    if r2 < floor:
        again, r2_again = fit(*measure(2 * repeats))
        if r2_again > r2:
            return again, r2_again
    return params, r2
