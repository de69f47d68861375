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
