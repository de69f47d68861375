"""Predicting a generation job's time before it runs, from the workers' calibration.

Each worker publishes its step cost model (EB+'s calibration: a prefill step of L tokens
costs α_p + β_p·L, a decode step of k sequences α_d + β_d·k, a mixed step the larger α
plus both terms) and the limits its planner works within (policy, step budget, batch
size, KV cache). The prediction runs the job's sequences through the same planners the
engines run, on the virtual clock of `scheduler/sim/simulator.py`, charging each step
what the calibration says it costs. The items are dealt to the workers in turn, an
item's n samples together (the scheduler spreads a job's sequences by free capacity; for
workers of one kind that is an even split), and the job takes as long as its slowest
worker.

What it does not see: the time before the first step (the submit, the input's check),
and the cluster's own per-item work around the engine. A sequence's output length is
known only where it cannot end early (`ignore_eos`): elsewhere max_tokens is used and the
prediction is an upper bound, and says so.
"""

from __future__ import annotations

from dataclasses import dataclass

from shoal.scheduler.adaptive_planner import AdaptivePlanner
from shoal.scheduler.cost_model import CostModel
from shoal.scheduler.exclusive_planner import ExclusiveBatchPlanner
from shoal.scheduler.sim.simulator import SimSeq, SimWorker
from shoal.scheduler.step_planner import MixedBatchPlanner, PlannerConfig

FAR = 1e18  # a horizon no job reaches: fast-forward as far as the batch allows


@dataclass(frozen=True)
class WorkerShape:
    """What one worker publishes that its steps' times follow from."""

    cost: CostModel
    policy: str
    budget: int  # tokens per step
    max_seqs: int
    kv_tokens: int
    block_size: int
    chunked_prefill: bool = True

    @classmethod
    def from_info(cls, info: dict) -> "WorkerShape":
        """From a worker's membership info; raises KeyError naming what it lacks."""
        if not info.get("calibration"):
            raise KeyError("calibration")
        return cls(CostModel.from_dict(info["calibration"]), info["policy"], int(info["budget"]),
                   int(info["max_seqs"]), int(info["kv_tokens"]), int(info["block_size"]),
                   bool(info.get("chunked_prefill", True)))

    def planner(self):
        cfg = PlannerConfig(block_size=self.block_size, max_num_batched_tokens=self.budget,
                            max_num_seqs=self.max_seqs, chunked_prefill=self.chunked_prefill,
                            num_blocks=self.kv_tokens // self.block_size)
        if self.policy == "eb":
            return ExclusiveBatchPlanner(cfg, self.cost)
        if self.policy == "ebplus":
            return AdaptivePlanner(cfg, self.cost)
        return MixedBatchPlanner(cfg)


@dataclass(frozen=True)
class GenerationPrediction:
    seconds: float  # the engines' time, first step to last
    output_tokens: int
    steps: int
    workers: int
    upper_bound: bool  # some sequence may end before max_tokens

    @property
    def tokens_per_s(self) -> float:
        return self.output_tokens / self.seconds if self.seconds else 0.0

    def summary(self) -> str:
        bound = " at most (sequences that end before max_tokens take less)" if self.upper_bound else ""
        return (f"{self.seconds:.1f}s{bound} for {self.output_tokens} output tokens on {self.workers} worker(s), "
                f"{self.tokens_per_s:.0f} output tok/s, {self.steps} steps (the engines' time; the submit and "
                "the cluster's per-item work come on top)")


def simulate_worker(shape: WorkerShape, lengths: list[tuple[int, int]]) -> tuple[float, int]:
    """(seconds, steps) of one worker running these (prompt, output) lengths, all
    waiting from the start, in order."""
    worker = SimWorker(shape.planner(), shape.cost, shape.kv_tokens // shape.block_size, shape.block_size,
                       window=shape.max_seqs)
    for i, (prompt, output) in enumerate(lengths):
        worker.add(SimSeq(i, max(1, prompt), max(1, output), arrival=i))
    while worker.busy:
        if not worker.fast_forward(FAR):
            worker.step()
    return worker.clock, worker.steps


def predict_generation(lengths: list[tuple[int, int]], workers: list[WorkerShape],
                       upper_bound: bool = False, per_item: list[int] | None = None) -> GenerationPrediction:
    """The job of these (prompt tokens, output tokens) sequences on these workers.
    `per_item`: how many of the consecutive sequences each item has (its n samples run
    on one worker, as the scheduler places them); None: one each."""
    if not workers:
        raise ValueError("no worker to predict for")
    if per_item is not None and sum(per_item) != len(lengths):
        raise ValueError(f"per_item counts {sum(per_item)} sequences, lengths has {len(lengths)}")
    shares: list[list[tuple[int, int]]] = [[] for _ in workers]
    start = 0
    for k, n in enumerate(per_item if per_item is not None else [1] * len(lengths)):
        shares[k % len(workers)] += lengths[start:start + n]
        start += n
    runs = [simulate_worker(w, share) for w, share in zip(workers, shares)]
    return GenerationPrediction(max(t for t, _ in runs), sum(o for _, o in lengths), sum(s for _, s in runs),
                                len(workers), upper_bound)
