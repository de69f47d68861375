import numpy as np
import pytest

from shoal.scheduler.output_length_model import OutputLengthModel


def test_constant_hazard_recovers_p():
    rng = np.random.default_rng(0)
    m = OutputLengthModel(window=500, refit_every=100, min_samples=30)
    for n in rng.geometric(1 / 200, size=500):
        m.observe(int(n), 100)
    assert m.p0 == pytest.approx(1 / 200, rel=0.25)
    assert m.eta < 2e-5
    assert m.mean_prompt == 100


def test_increasing_hazard_has_positive_eta():
    rng = np.random.default_rng(1)
    m = OutputLengthModel()
    p0, eta = 1e-3, 4e-5
    for _ in range(500):
        t = 1
        while rng.random() > p0 + eta * t:
            t += 1
        m.observe(t)
    assert m.eta == pytest.approx(eta, rel=0.5)


def test_refits_only_every_n_after_minimum():
    m = OutputLengthModel(refit_every=100, min_samples=30)
    assert not any(m.observe(50) for _ in range(29))
    assert m.observe(50)  # the 30th sample fits the first time
    fits = [m.observe(50) for _ in range(100)]
    assert fits.count(True) == 1 and fits[-1]
