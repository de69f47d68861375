"""EB: exclusive batching. Pure-decode steps over N̂ sequences until k̂ of them finish,
then pure-prefill steps that admit exactly enough new ones to refill to N̂ (EB+).

θ̂ = k̂/N̂ follows the asymptotic threshold of the online hazard estimate (with the
increasing-hazard correction), EMA-smoothed and clamped; N̂ is the memory-safe batch
size of Prop. 3, capped by max_num_seqs. A runtime guard stops a refill while free KV
blocks are below one per running sequence, so decodes never starve for blocks.
"""

from __future__ import annotations

from collections.abc import Sequence

from shoal.scheduler import eb_math
from shoal.scheduler.cost_model import CostModel
from shoal.scheduler.output_length_model import OutputLengthModel
from shoal.scheduler.step_planner import MixedBatchPlanner, PlannerConfig, SeqView, StepPlan

EMA = 0.3


class ExclusiveBatchPlanner(MixedBatchPlanner):
    name = "eb"

    def __init__(self, config: PlannerConfig, cost: CostModel, lengths: OutputLengthModel | None = None):
        super().__init__(config)
        self.cost = cost
        self.lengths = lengths or OutputLengthModel()
        self.phase = "prefill"
        self.theta = eb_math.clamp_theta(self._theta_star())
        self.n_hat = self._n_hat()
        self.k_hat = self._k_hat()

    # -- statistics -------------------------------------------------------------------

    def _theta_star(self) -> float:
        p0 = self.lengths.p0
        th0 = eb_math.asymptotic_threshold(eb_math.hazard_rate(min(p0, 0.999)), self.cost)
        n = getattr(self, "n_hat", self.cfg.max_num_seqs)
        return th0 + eb_math.increasing_hazard_correction(th0, p0, self.lengths.eta, n, self.cost)

    def _n_hat(self) -> int:
        cap = self.cfg.num_blocks * self.cfg.block_size
        mu_l = self.lengths.mean_prompt or 256.0
        n = eb_math.memory_safe_batch(cap, self.theta, self.lengths.p0, mu_l) if cap else self.cfg.max_num_seqs
        return max(1, min(n, self.cfg.max_num_seqs))

    def _k_hat(self) -> int:
        return max(1, int(self.theta * self.n_hat))

    def observe_finished(self, output_len: int, prompt_len: int) -> None:
        if self.lengths.observe(output_len, prompt_len):
            self.theta = eb_math.clamp_theta((1 - EMA) * self.theta + EMA * self._theta_star())
            self.n_hat = self._n_hat()
            self.k_hat = self._k_hat()

    def stats(self) -> dict:
        return {"policy": self.name, "mode": "eb", "phase": self.phase, "theta": self.theta,
                "k_hat": self.k_hat, "n_hat": self.n_hat, "p0": self.lengths.p0, "eta": self.lengths.eta}

    # -- planning ---------------------------------------------------------------------

    def plan(self, running: Sequence[SeqView], waiting: Sequence[SeqView], free_blocks: int) -> StepPlan:
        decoding = [v for v in running if v.decoding]
        prefilling = [v for v in running if not v.decoding]
        if self.phase == "decode":
            refill_due = len(running) <= self.n_hat - self.k_hat and waiting
            if refill_due or not decoding:
                self.phase = "prefill"
        if self.phase == "prefill":
            plan = self._plan_prefill(running, prefilling, waiting, free_blocks)
            if plan.chunks:
                return plan
            self.phase = "decode"  # refill done (or impossible): decode what runs
        plan = self._plan_decode(decoding, free_blocks)
        if not plan.chunks and not plan.preempted and (running or waiting):
            # Neither pure phase can move (blocks held by half-prefilled sequences):
            # MB's plan, which preempts, breaks the deadlock.
            return MixedBatchPlanner.plan(self, running, waiting, free_blocks)
        return plan

    def _plan_decode(self, decoding: Sequence[SeqView], free_blocks: int) -> StepPlan:
        # MB's loop over decodes only: preemption of the newest when blocks run out.
        return super().plan(decoding, [], free_blocks)

    def _plan_prefill(self, running, prefilling, waiting, free_blocks) -> StepPlan:
        plan = StepPlan()
        budget = self.cfg.max_num_batched_tokens
        bs = self.cfg.block_size
        for v in prefilling:  # finish admitted prompts first
            n = min(v.num_tokens - v.num_computed, budget)
            need = max(0, -(-(v.num_computed + n) // bs) - v.num_blocks)
            if n <= 0 or need > free_blocks:
                break
            plan.chunks.append((v.seq_id, n))
            budget -= n
            free_blocks -= need
        count = len(running)
        for v in waiting:
            if budget <= 0 or count >= self.n_hat:
                break
            n = min(v.num_tokens - v.num_computed, budget)
            need = v.cached_free_blocks + -(-(v.num_computed + n) // bs) - v.num_blocks
            # Guard: keep a block per running sequence for its decode growth.
            if need > free_blocks - count:
                break
            plan.chunks.append((v.seq_id, n))
            budget -= n
            free_blocks -= need
            count += 1
        return plan
