"""A simulated worker node: what a worker does with its sequences, on a virtual clock.

It holds what the scheduler assigned (queued, running in its engine, or paused between
operations), runs its engine (`SimWorker`: the real step planner and a step-time model
from a published calibration), resumes a paused sequence when its retrieval is done,
hands sequences over when asked to move them (queued first, then paused, then those
with the least progress, as the real worker picks), and reports what finished.

A simulated item is `{"id", "segments": [[new_prompt_tokens, output_tokens], ...],
"pause_s"}`: a program that generates once per segment, with an operation (a retrieval)
of `pause_s` between segments. Each segment's prompt extends the sequence so far, whose
KV stays cached on the worker that computed it.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

from shoal.scheduler.cost_model import CostModel
from shoal.scheduler.kv_transfer import decide_kv
from shoal.scheduler.sim.simulator import SimSeq, SimWorker, StepTimeModel
from shoal.scheduler.step_planner import MixedBatchPlanner, PlannerConfig
from shoal.scheduler.worker_info import WorkerInfo


NEW_PROGRAM = 1 << 40  # arrival offset of programs not yet started: they queue behind those under way


@dataclass
class HeldSeq:
    job_id: str
    item: dict
    segment: int = 0
    context: int = 0  # tokens of the segments before this one (prompt and output)
    generated: int = 0  # tokens generated in this segment when it was taken out of an engine
    cached: int = 0  # tokens whose KV this worker holds, for when it enters the engine again
    engine_id: int | None = None  # while in the engine

    @property
    def segments(self) -> list:
        return self.item["segments"]

    def tokens_so_far(self) -> int:
        return self.context + (self.segments[self.segment][0] + self.generated if self.segment < len(self.segments) else 0)


@dataclass(frozen=True)
class WorkerSpec:
    """One simulated worker's hardware: its calibration and limits."""

    cost: CostModel
    r_star: float = 0.8  # see StepTimeModel
    max_seqs: int = 256
    budget: int = 8192  # tokens per step
    kv_blocks: int = 1 << 16
    block_size: int = 16
    kv_bytes_per_token: int = 147456  # Qwen3-8B: 36 layers x 8 KV heads x 128 x K,V x bf16


class SimWorkerNode:
    def __init__(self, node_id: str, spec: WorkerSpec, incarnation: int = 1):
        self.node_id, self.spec, self.incarnation = node_id, spec, incarnation
        planner = MixedBatchPlanner(PlannerConfig(spec.block_size, spec.budget, spec.max_seqs,
                                                  num_blocks=spec.kv_blocks))
        self.engine = SimWorker(planner, StepTimeModel(spec.cost, spec.r_star), spec.kv_blocks, spec.block_size,
                                window=spec.max_seqs)
        self.held: dict[tuple, HeldSeq] = {}  # (job_id, seq_id) -> sequence
        self.in_engine: dict[int, tuple] = {}  # engine id -> key
        self.resuming: list = []  # heap of (time, n, key): paused (an operation under way) or arriving
        self.finished: dict[str, list] = {}  # job_id -> [(seq_id, when)] finished since the last report
        self.moved: dict[str, list] = {}  # job_id -> [[seq_id, target], ...] since the last report
        self.tokens: dict[str, int] = {}
        self.busy_s = 0.0
        self.finish_times: list[float] = []
        self._next_engine_id = 0
        self._n = 0

    @property
    def info(self) -> WorkerInfo:
        s = self.spec
        return WorkerInfo(self.node_id, self.incarnation, max_seqs=s.max_seqs, kv_tokens=s.kv_blocks * s.block_size,
                          speed=1.0 / s.cost.beta_d)

    @property
    def clock(self) -> float:
        return self.engine.clock

    @property
    def idle(self) -> bool:
        return not self.held

    # -- work in ---------------------------------------------------------------------------------

    def assign(self, job_id: str, assignments, now: float) -> None:
        """New sequences (an assignment already held is dropped, as the real worker does)."""
        self._catch_up(now)
        for a in assignments:
            key = (job_id, a["seq_id"])
            if key not in self.held:
                self.held[key] = HeldSeq(job_id, a["item"])
                self._enter(key)

    def receive(self, job_id: str, seq_id, seq: HeldSeq, at: float) -> None:
        """A moved sequence that arrives at `at` (after its KV, if shipped)."""
        key = (job_id, seq_id)
        self.held[key] = seq
        self._n += 1
        heapq.heappush(self.resuming, (at, self._n, key))

    def _catch_up(self, now: float) -> None:
        if not self.engine.busy and self.engine.clock < now:
            self.engine.clock = now  # idle until now: new work starts now, not in the past

    def _enter(self, key: tuple) -> None:
        """Puts a held sequence's current segment into the engine."""
        h = self.held[key]
        new_prompt, out = h.segments[h.segment]
        prompt = h.context + new_prompt + h.generated
        eid = self._next_engine_id
        self._next_engine_id += 1
        # A program that is under way (a later segment, or one moved here) is admitted
        # before programs not yet started, as the worker's engine does: it finishes
        # sooner, and its cached prefix is not left to be evicted while it waits.
        started = h.segment > 0 or h.generated > 0 or h.cached > 0
        order = eid if started else NEW_PROGRAM + eid
        self.engine.add(SimSeq(eid, prompt, out - h.generated, computed=min(h.cached, prompt), arrival=order))
        h.engine_id, h.cached = eid, 0
        self.in_engine[eid] = key

    # -- time ------------------------------------------------------------------------------------

    def advance(self, until: float) -> None:
        """Runs the engine up to `until` (a step that starts before it may end after it)."""
        eng = self.engine
        while True:
            while self.resuming and self.resuming[0][0] <= max(eng.clock, 0.0):
                _, _, key = heapq.heappop(self.resuming)
                if key in self.held:
                    self._enter(key)
            if eng.busy:
                if eng.clock >= until:
                    return
                before = eng.clock
                if not eng.fast_forward(until):
                    for s in eng.step():
                        self._segment_done(s)
                self.busy_s += eng.clock - before
                continue
            nxt = self.resuming[0][0] if self.resuming else None
            if nxt is not None and nxt < until:
                eng.clock = max(eng.clock, nxt)
                continue
            eng.clock = max(eng.clock, until)
            return

    def _segment_done(self, s: SimSeq) -> None:
        key = self.in_engine.pop(s.seq_id)
        h = self.held[key]
        new_prompt, out = h.segments[h.segment]
        h.context += new_prompt + out
        h.segment += 1
        h.generated, h.engine_id = 0, None
        self.tokens[h.job_id] = self.tokens.get(h.job_id, 0) + out
        if h.segment < len(h.segments):
            h.cached = h.context  # its KV stays here while the operation runs
            self._n += 1
            heapq.heappush(self.resuming, (self.engine.clock + h.item.get("pause_s", 0.0), self._n, key))
            return
        del self.held[key]
        self.finished.setdefault(h.job_id, []).append((key[1], self.engine.clock))
        self.finish_times.append(self.engine.clock)

    # -- moves -------------------------------------------------------------------------------------

    def take(self, job_id: str, target: str, count: int | None, seq_ids, now: float) -> list[tuple]:
        """Takes sequences out to move them to `target`: the listed ones, or `count` of
        this worker's choosing — queued first, then paused, then running, the least
        progress first. Returns [(seq_id, HeldSeq with its KV tokens in `cached`)]."""
        self._catch_up(now)
        mine = [k for k in self.held if k[0] == job_id]
        if seq_ids is not None:
            wanted = set(seq_ids)
            keys = [k for k in mine if k[1] in wanted]
        else:
            def order(k):
                h = self.held[k]
                state = 1 if h.engine_id is None else 2 if h.engine_id in self.engine.running else 0
                return state, h.tokens_so_far()

            n = len(mine) if count is None or count < 0 else count
            keys = sorted(mine, key=order)[:n]
        out = []
        for k in keys:
            h = self.held.pop(k)
            if h.engine_id is not None:
                s = self.engine.remove(h.engine_id)
                del self.in_engine[h.engine_id]
                h.generated += s.generated
                h.cached, h.engine_id = s.computed, None
            out.append((k[1], h))
            self.moved.setdefault(job_id, []).append([k[1], target])
        return out

    # -- reporting ---------------------------------------------------------------------------------

    def report(self) -> list[tuple[str, list, list, int]]:
        """[(job_id, [(seq_id, finished at)], moved, tokens)] since the last report."""
        jobs = set(self.finished) | set(self.moved)
        out = [(j, self.finished.pop(j, []), self.moved.pop(j, []), self.tokens.pop(j, 0)) for j in jobs]
        return out


def ship_or_reprefill(seq: HeldSeq, spec: WorkerSpec, link_bytes_per_s: float) -> tuple[float, int]:
    """A moving sequence's delay and the KV tokens the target gets: ship its KV when the
    link beats recomputing it (`decide_kv`), else nothing (the target prefills again)."""
    tokens = seq.cached
    if tokens <= 0:
        return 0.0, 0
    d = decide_kv(tokens * spec.kv_bytes_per_token, tokens, link_bytes_per_s, spec.cost, per_transfer_s=1e-3)
    return (d.ship_s, tokens) if d.ship else (0.0, 0)
