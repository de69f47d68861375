"""EB+: runs MB or EB and switches between them online by the crossover condition of
Prop. 4, with hysteresis and a cooldown (EB+).

Every `decide_every` completions it evaluates LHS = β_MB(r̂) − β_EB and RHS from the
calibrated cost model, the prompt and output means, θ̂, k̂ and the current concurrency;
EB when LHS > RHS + δ, MB when LHS < RHS − δ, otherwise it stays. The prompt mean is
that of the sequences in flight (known on arrival); the output mean is that of the
last 64 completions, so a shift in the traffic moves the decision within a few dozen
completions rather than a whole hazard window.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from shoal.scheduler import eb_math
from shoal.scheduler.cost_model import CostModel
from shoal.scheduler.exclusive_planner import ExclusiveBatchPlanner
from shoal.scheduler.output_length_model import OutputLengthModel
from shoal.scheduler.step_planner import MixedBatchPlanner, PlannerConfig, SeqView, StepPlan

log = logging.getLogger(__name__)


class AdaptivePlanner:
    name = "ebplus"

    def __init__(self, config: PlannerConfig, cost: CostModel, delta: float = 1e-5,
                 decide_every: int = 8, cooldown: int = 2, lengths: OutputLengthModel | None = None,
                 clock=None):
        """`clock`: wall time of a switch, for what the worker shows (none in a simulation)."""
        self.cfg = config
        self.clock = clock
        self.cost = cost
        self.delta = delta
        self.decide_every = decide_every
        self.cooldown = cooldown
        self.lengths = lengths or OutputLengthModel()
        self.mb = MixedBatchPlanner(config)
        self.eb = ExclusiveBatchPlanner(config, cost, self.lengths)
        self.mode = "mb"
        self.lhs = self.rhs = 0.0
        self.switches: list[tuple[int, str]] = []  # (completion count, new mode)
        self.switched_at: float | None = None  # by `clock`
        self.completions = 0
        self._hold = 0
        self._concurrency = 0
        self._mean_prompt_now: float | None = None
        self.theta0 = self.eb.theta

    def observe_finished(self, output_len: int, prompt_len: int) -> None:
        self.eb.observe_finished(output_len, prompt_len)  # shares self.lengths
        self.completions += 1
        if self.completions % self.decide_every == 0:
            self.decide()

    def decide(self) -> str:
        mu_l = self._mean_prompt_now or self.lengths.mean_prompt
        if mu_l is None or not self.lengths.lengths:
            return self.mode
        mu_o = self.lengths.recent_mean_output()
        n = max(1, min(self.eb.n_hat, self._concurrency or self.eb.n_hat))
        if n < 2:
            return self.mode  # one sequence left: both modes run the same steps
        # θ₀ of the traffic now (constant hazard 1/μ_O): the EMA'd θ̂ that EB itself runs
        # with lags a shift by a whole hazard window and would keep EB+ on the old side.
        theta0 = eb_math.clamp_theta(eb_math.asymptotic_threshold(eb_math.hazard_rate(min(1.0 / mu_o, 0.999)), self.cost))
        k = max(1, int(theta0 * n))
        self.theta0 = theta0
        self.lhs, self.rhs = eb_math.crossover(self.cost, mu_l, mu_o, theta0, k, n)
        if self._hold > 0:
            self._hold -= 1
            return self.mode
        want = self.mode
        if self.lhs > self.rhs + self.delta:
            want = "eb"
        elif self.lhs < self.rhs - self.delta:
            want = "mb"
        if want != self.mode:
            log.info("[ebplus] %s -> %s after %d completions (LHS %.3g, RHS %.3g)", self.mode, want,
                     self.completions, self.lhs, self.rhs)
            self.mode = want
            self.switches.append((self.completions, want))
            self.switched_at = self.clock() if self.clock else None
            self._hold = self.cooldown
            if want == "eb":
                self.eb.phase = "decode"
        return self.mode

    def plan(self, running: Sequence[SeqView], waiting: Sequence[SeqView], free_blocks: int) -> StepPlan:
        self._concurrency = len(running) + len(waiting)
        if self._concurrency:
            self._mean_prompt_now = (sum(v.num_prompt_tokens for v in running) + sum(v.num_prompt_tokens for v in waiting)) / self._concurrency
        return (self.eb if self.mode == "eb" else self.mb).plan(running, waiting, free_blocks)

    def stats(self) -> dict:
        return {"policy": self.name, "mode": self.mode, "theta": self.eb.theta, "theta0": self.theta0, "k_hat": self.eb.k_hat,
                "n_hat": self.eb.n_hat, "lhs": self.lhs, "rhs": self.rhs, "switches": len(self.switches),
                "switched_at": self.switched_at}
