"""A virtual-clock simulator that drives the real planners with a step-time model.

No sockets and no device: a `SimWorker` holds sequences and KV blocks like the engine
does, asks its planner for each step, charges the step's time from `StepTimeModel`,
and feeds completions back to the planner. `simulate` runs a closed-loop batch job (a
new request enters when one finishes, keeping `concurrency` in flight) over one worker;
a cluster-level driver can hold several workers and a placement policy on one clock.

Step times. Pure prefill: α_p + β_p·P. Pure decode: α_d + β_d·D. A mixed step of P
prefill and D decode tokens: max(α_p, α_d) + β_p·P + (β_d + γ)·D: prefill tokens in the
step slow every decode's attention, which streams its KV cache, by γ. γ is set from r*,
the decode share above which a mixed step's marginal cost per token exceeds pure
decode's (the paper: 0.8 on H200, 0.2 on RTX PRO 6000): the marginal cost
m(r) = β_p(1−r) + (β_d+γ)·r exceeds β_d exactly when r/(1−r) > (β_d − β_p)/γ, so
γ = (β_d − β_p)(1 − r*)/r*. β_MB(r) stays EB+'s input, not the simulator's clock.
"""

from __future__ import annotations

import bisect
import random
from dataclasses import dataclass, field

from shoal.scheduler.cost_model import CostModel
from shoal.scheduler.step_planner import SeqView


@dataclass(frozen=True)
class StepTimeModel:
    cost: CostModel
    r_star: float  # decode share where mixed marginal cost reaches pure decode

    @property
    def gamma(self) -> float:
        return max(0.0, (self.cost.beta_d - self.cost.beta_p) * (1 - self.r_star) / self.r_star)

    def step_time(self, prefill_tokens: int, decode_seqs: int) -> float:
        c = self.cost
        if prefill_tokens == 0:
            return c.decode_time(decode_seqs) if decode_seqs else 0.0
        if decode_seqs == 0:
            return c.prefill_time(prefill_tokens)
        return max(c.alpha_p, c.alpha_d) + c.beta_p * prefill_tokens + (c.beta_d + self.gamma) * decode_seqs


@dataclass
class SimSeq:
    seq_id: int
    prompt_len: int
    output_len: int
    computed: int = 0
    generated: int = 0
    blocks: int = 0
    arrival: int = 0

    @property
    def num_tokens(self) -> int:
        return self.prompt_len + self.generated


@dataclass
class Request:
    prompt_len: int
    output_len: int


@dataclass
class SimResult:
    time: float
    tokens: int
    steps: int
    mode_time: dict = field(default_factory=dict)  # seconds spent with each planner mode
    switches: list = field(default_factory=list)
    # While requests were still waiting to enter, concurrency was at its target: the
    # steady state the paper's throughput figures describe (the drain tail excluded).
    steady_time: float = 0.0
    steady_tokens: int = 0

    @property
    def throughput(self) -> float:
        return self.tokens / self.time if self.time else 0.0

    @property
    def steady_throughput(self) -> float:
        return self.steady_tokens / self.steady_time if self.steady_time else 0.0


class SimWorker:
    """One simulated worker: the engine's bookkeeping without a model."""

    def __init__(self, planner, time_model: StepTimeModel, num_blocks: int, block_size: int,
                 window: int | None = None):
        self.planner = planner
        # The planner sees the first `window` waiting sequences (None: all). MB admits at
        # most its max_num_seqs per step, so a window of that size changes nothing there
        # and keeps a step's cost flat when thousands wait (a statically split job).
        self.window = window
        self.time_model = time_model
        self.block_size = block_size
        self.free_blocks = num_blocks
        self.running: dict[int, SimSeq] = {}
        self.waiting: list[SimSeq] = []
        self.clock = 0.0
        self.steps = 0
        self.tokens = 0

    def add(self, seq: SimSeq) -> None:
        """Queues a sequence by its `arrival` (the order the planner sees waiting ones in)."""
        if self.waiting and self.waiting[-1].arrival > seq.arrival:
            bisect.insort(self.waiting, seq, key=lambda s: s.arrival)
        else:
            self.waiting.append(seq)

    def remove(self, seq_id) -> SimSeq | None:
        """Takes a sequence out (it moves to another worker); its blocks are freed."""
        s = self.running.pop(seq_id, None)
        if s is None:
            s = next((w for w in self.waiting if w.seq_id == seq_id), None)
            if s is None:
                return None
            self.waiting.remove(s)
        self.free_blocks += s.blocks
        s.blocks = 0
        return s

    @property
    def busy(self) -> bool:
        return bool(self.running or self.waiting)

    def fast_forward(self, horizon: float) -> int:
        """Runs identical decode steps in one go while nothing can change the batch: every
        running sequence decodes, none finishes, none can be admitted (nothing waits, or
        the batch is full) and the blocks suffice. Stops before the first finish and once
        the clock passes `horizon`. Returns the steps run (0: take a normal step)."""
        run = self.running
        if not run or any(s.computed < s.prompt_len for s in run.values()):
            return 0
        cfg = getattr(self.planner, "cfg", None)
        if cfg is None or len(run) > cfg.max_num_batched_tokens:
            return 0
        if self.waiting and len(run) < cfg.max_num_seqs:
            return 0
        k = min(s.output_len - s.generated for s in run.values()) - 1
        dt = self.time_model.step_time(0, len(run))
        k = min(k, max(0, int((horizon - self.clock) / dt) + 1))
        if k <= 0:
            return 0
        bs = self.block_size
        need = sum(-(-(s.computed + k) // bs) - s.blocks for s in run.values())
        if need > self.free_blocks:
            return 0
        for s in run.values():
            s.computed += k
            s.generated += k
            grown = -(-s.computed // bs)
            self.free_blocks -= grown - s.blocks
            s.blocks = grown
        self.clock += k * dt
        self.steps += k
        self.tokens += k * len(run)
        return k

    def _view(self, s: SimSeq) -> SeqView:
        return SeqView(s.seq_id, s.num_tokens, s.computed, s.blocks, 0, s.prompt_len)

    def step(self) -> list[SimSeq]:
        waiting = self.waiting if self.window is None else self.waiting[:self.window]
        plan = self.planner.plan([self._view(s) for s in self.running.values()],
                                 [self._view(s) for s in waiting], self.free_blocks)
        for sid in plan.preempted:
            s = self.running.pop(sid)
            self.free_blocks += s.blocks
            s.blocks, s.computed = 0, 0
            self.waiting.append(s)
        if plan.preempted:
            self.waiting.sort(key=lambda s: s.arrival)  # as the engine re-queues them
            waiting = self.waiting if self.window is None else self.waiting[:self.window + len(plan.preempted)]
        by_id = {s.seq_id: s for s in waiting}
        prefill = decode = 0
        done = []
        for sid, n in plan.chunks:
            s = self.running.get(sid)
            if s is None:
                s = by_id[sid]
                self.waiting.remove(s)
                self.running[sid] = s
            need = -(-(s.computed + n) // self.block_size) - s.blocks
            self.free_blocks -= need
            s.blocks += need
            if s.computed >= s.prompt_len:
                decode += 1
            else:
                prefill += n
            s.computed += n
            if s.computed == s.num_tokens:
                s.generated += 1
                if s.generated >= s.output_len:
                    done.append(s)
        dt = self.time_model.step_time(prefill, decode)
        if not plan.chunks:
            raise RuntimeError("planner scheduled nothing with work pending")
        self.clock += dt
        self.steps += 1
        self.tokens += prefill + decode
        for s in done:
            del self.running[s.seq_id]
            self.free_blocks += s.blocks
            self.planner.observe_finished(s.output_len, s.prompt_len)
        return done


def synthetic_requests(n: int, mean_prompt: int, mean_output: int, jitter: float = 0.5, seed: int = 0) -> list[Request]:
    """Lengths uniform within ±jitter of their means (the paper's synthetic workloads)."""
    r = random.Random(seed)
    j = lambda m: max(1, int(round(m * (1 + r.uniform(-jitter, jitter)))))
    return [Request(j(mean_prompt), j(mean_output)) for _ in range(n)]


def simulate(planner, time_model: StepTimeModel, phases: list[tuple[list[Request], int]],
             num_blocks: int, block_size: int = 16) -> SimResult:
    """One closed-loop stream of requests: a new one enters whenever fewer than the
    current phase's concurrency are in flight. A phase ends when its last request has
    entered, so the next phase's traffic mixes in without a drain (a shift, not a
    restart); only the end of the last phase drains."""
    w = SimWorker(planner, time_model, num_blocks, block_size)
    mode_time: dict = {}
    steady_time, steady_tokens = 0.0, 0
    next_id = in_flight = 0
    queue = [(req, conc) for requests, conc in phases for req in requests]
    pos = 0
    while pos < len(queue) or in_flight:
        while pos < len(queue) and in_flight < queue[pos][1]:
            req = queue[pos][0]
            w.add(SimSeq(next_id, req.prompt_len, req.output_len, arrival=next_id))
            next_id += 1
            pos += 1
            in_flight += 1
        before, tokens_before = w.clock, w.tokens
        mode = getattr(planner, "mode", planner.name)
        in_flight -= len(w.step())
        mode_time[mode] = mode_time.get(mode, 0.0) + (w.clock - before)
        if pos < len(queue):
            steady_time += w.clock - before
            steady_tokens += w.tokens - tokens_before
    return SimResult(w.clock, w.tokens, w.steps, mode_time, list(getattr(planner, "switches", [])),
                     steady_time, steady_tokens)
