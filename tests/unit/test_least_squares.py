"""The calibration's fits: a noisy measurement is taken again before a fit is refused."""

from __future__ import annotations

import pytest

from shoal.scheduler.least_squares import fit_line_nonnegative, fit_measured

pytestmark = pytest.mark.timeout(30)

LINE = ([64, 128, 256, 512], [0.010, 0.017, 0.031, 0.059])  # 3 ms + 0.11 ms/token
NOISY = ([64, 128, 256, 512], [0.030, 0.011, 0.052, 0.020])  # a slow step at 64 and 256


def measurer(*results):
    calls = []

    def measure(repeats):
        calls.append(repeats)
        return results[min(len(calls), len(results)) - 1]
    return measure, calls


def test_a_good_fit_is_measured_once():
    measure, calls = measurer(LINE)
    (a, b), r2 = fit_measured(measure, fit_line_nonnegative, 4, 0.9)
    assert calls == [4]
    assert r2 > 0.99 and b == pytest.approx(1.1e-4, rel=0.05)


def test_a_fit_below_the_floor_is_measured_again_with_twice_the_repeats():
    measure, calls = measurer(NOISY, LINE)
    (a, b), r2 = fit_measured(measure, fit_line_nonnegative, 4, 0.9)
    assert calls == [4, 8]
    assert r2 > 0.99 and b == pytest.approx(1.1e-4, rel=0.05)


def test_the_better_of_two_poor_fits_is_kept_and_still_refusable():
    poor = ([64, 128, 256, 512], [0.05, 0.01, 0.05, 0.01])  # R² ~0.2; NOISY's is ~0
    measure, calls = measurer(poor, NOISY)
    first = fit_line_nonnegative(*poor)
    params, r2 = fit_measured(measure, fit_line_nonnegative, 4, 0.9)
    assert calls == [4, 8]
    assert r2 == pytest.approx(first[1]) and r2 < 0.9  # the floor still refuses it downstream
