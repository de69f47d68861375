"""Online estimate of the output-length hazard (EB+).

Over the last `window` finished sequences, ĥ(t) = #{len = t} / #{len ≥ t}; a weighted
least-squares line through ĥ on the 5th..95th percentile of lengths gives
h(t) = p₀ + η·t (η = 0: constant hazard). Refit every `refit_every` completions once
`min_samples` exist; until then, p₀ = 1 / mean length.
"""

from __future__ import annotations

from collections import deque

import numpy as np

from shoal.scheduler.least_squares import fit_polynomial


class OutputLengthModel:
    def __init__(self, window: int = 500, refit_every: int = 100, min_samples: int = 30, prior_mean: float = 256.0):
        self.lengths: deque[int] = deque(maxlen=window)
        self.prompts: deque[int] = deque(maxlen=window)
        self.refit_every = refit_every
        self.min_samples = min_samples
        self.prior_mean = prior_mean
        self.p0 = 1.0 / prior_mean
        self.eta = 0.0
        self._since_fit = 0
        self.fits = 0

    @property
    def mean_output(self) -> float:
        return float(np.mean(self.lengths)) if self.lengths else self.prior_mean

    def recent_mean_output(self, n: int = 64) -> float:
        """Mean of the last n outputs: follows a shift in the workload sooner than the
        hazard window does."""
        if not self.lengths:
            return self.prior_mean
        tail = list(self.lengths)[-n:]
        return float(sum(tail) / len(tail))

    @property
    def mean_prompt(self) -> float | None:
        return float(np.mean(self.prompts)) if self.prompts else None

    def observe(self, output_len: int, prompt_len: int | None = None) -> bool:
        """Records a finished sequence; returns True when this completion refit the model."""
        self.lengths.append(max(1, int(output_len)))
        if prompt_len is not None:
            self.prompts.append(int(prompt_len))
        self._since_fit += 1
        if len(self.lengths) >= self.min_samples and (self.fits == 0 or self._since_fit >= self.refit_every):
            self.fit()
            return True
        return False

    def fit(self) -> None:
        lens = np.asarray(self.lengths)
        self._since_fit = 0
        self.fits += 1
        lo, hi = np.percentile(lens, [5, 95])
        ts = np.arange(max(1, int(lo)), int(hi) + 1)
        at_least = np.array([(lens >= t).sum() for t in ts], dtype=float)
        exactly = np.array([(lens == t).sum() for t in ts], dtype=float)
        keep = at_least > 0
        ts, at_least, exactly = ts[keep], at_least[keep], exactly[keep]
        mean_rate = 1.0 / float(lens.mean())
        if len(ts) < 3:
            self.p0, self.eta = mean_rate, 0.0
            return
        # Weight each t by how many sequences reached it: the estimate's precision.
        (p0, eta), _ = fit_polynomial(ts, exactly / at_least, 1, weights=at_least)
        if p0 <= 0 or not np.isfinite(p0):
            self.p0, self.eta = mean_rate, 0.0
        else:
            self.p0, self.eta = float(p0), max(0.0, float(eta))
