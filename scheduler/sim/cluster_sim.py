"""A cluster on a virtual clock: the scheduler core, simulated workers, storage in memory.

`ClusterSim` runs one job through the same `SchedulerCore` the scheduler node runs: every
tick the workers' reports become progress events, membership becomes `update_workers`,
and the commands the core returns are carried out here — storage commands by
`MemoryStorage`, assignments and moves by the `SimWorkerNode`s, a move taking the time
its KV needs on the link (or none, when re-prefilling is cheaper). A worker can be lost
at a given time: what it held is gone, as with kill -9.

`run_static` is the baseline a data-parallel launch gives: the items split evenly and
contiguously up front, each worker running its share with the same engine, no moves.

The ideal is the total work divided over the workers: each worker's work priced at its
full batch (`work_s`), combined as 1 / Σ 1/work.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

from shoal.scheduler import commands as cmd
from shoal.scheduler.core import SchedulerCore
from shoal.scheduler.job import Job
from shoal.scheduler.sim.memory_storage import MemoryStorage
from shoal.scheduler.sim.sim_worker_node import SimWorkerNode, WorkerSpec, ship_or_reprefill

FAR = 1e12  # a horizon past any job


@dataclass
class SimOutcome:
    name: str
    bct: float  # batch completion time: submission to the last result
    ideal: float  # total work over the workers
    floor: float  # the longest item alone
    finish_times: list  # sorted, one per item
    busy: list  # per bin: worker-seconds busy / (workers x bin)
    bin_s: float
    moves: int = 0  # MigrateSequences carried out
    moved: int = 0  # sequences moved
    shipped_bytes: int = 0  # KV sent over links
    reprefilled: int = 0  # moved sequences whose KV was dropped for a prefill on the target
    lost_workers: int = 0
    notes: dict = field(default_factory=dict)

    @property
    def vs_ideal(self) -> float:
        return self.bct / self.ideal if self.ideal else math.inf

    @property
    def tail_s(self) -> float:
        """The time the last 5% of the items took to finish."""
        t = self.finish_times
        return t[-1] - t[int(0.95 * (len(t) - 1))] if t else 0.0

    @property
    def utilization(self) -> float:
        return sum(self.busy) / len(self.busy) if self.busy else 0.0


def work_s(items: list[dict], spec: WorkerSpec) -> float:
    """Seconds a worker of `spec` needs for `items` at its full batch: prefill tokens at
    β_p, decode tokens at the per-sequence share of a full decode step."""
    c, b = spec.cost, spec.max_seqs
    per_decode = c.alpha_d / b + c.beta_d
    return sum(p * c.beta_p + o * per_decode for it in items for p, o in it["segments"])


def ideal_s(items: list[dict], specs: list[WorkerSpec]) -> float:
    kinds = {id(s): s for s in specs}  # workers of a kind share a spec: price the items once per kind
    work = {k: work_s(items, s) for k, s in kinds.items()}
    return 1.0 / sum(1.0 / work[id(s)] for s in specs)


def floor_s(items: list[dict], specs: list[WorkerSpec]) -> float:
    """The longest item alone on the fastest worker: no schedule finishes sooner."""
    def alone(it: dict, c) -> float:
        segs = it["segments"]
        return (sum(c.alpha_p + p * c.beta_p + o * (c.alpha_d + c.beta_d) for p, o in segs)
                + it.get("pause_s", 0.0) * (len(segs) - 1))
    costs = list({id(s.cost): s.cost for s in specs}.values())
    return max((min(alone(it, c) for c in costs) for it in items), default=0.0)


class ClusterSim:
    def __init__(self, specs: dict[str, WorkerSpec], tick_s: float = 0.5, link_bytes_per_s: float = 25e9,
                 moves: bool = True, losses: dict[str, float] | None = None, bin_s: float = 5.0):
        self.specs = specs
        self.tick_s = tick_s
        self.link = link_bytes_per_s
        self.moves = moves
        self.losses = losses or {}
        self.bin_s = bin_s

    def run(self, items: list[dict], name: str = "shoal", max_time: float = 1e7) -> SimOutcome:
        core = SchedulerCore(steal=self.moves)
        storage = MemoryStorage()
        job_id = "job"
        storage.add_input(job_id, items)
        core.add_job(Job(job_id, job_id, "sim", {}, len(items), "memory"))
        nodes = {w: SimWorkerNode(w, spec) for w, spec in self.specs.items()}
        out = SimOutcome(name, 0.0, ideal_s(items, list(self.specs.values())), floor_s(items, list(self.specs.values())),
                         [], [], self.bin_s)
        finish_at: dict = {}  # seq_id -> when its first result was stored
        busy_bins: list[float] = []
        t = 0.0
        while core.jobs[job_id].running:
            for w in [w for w in nodes if self.losses.get(w, math.inf) <= t]:
                del nodes[w]  # kill -9: what it held is gone with it
                out.lost_workers += 1
            for n in nodes.values():
                for job, finished, moved, tokens in n.report():
                    for sid, when in finished:
                        if storage.store(job, sid):
                            finish_at[sid] = when
                    core.progress(n.node_id, job, [sid for sid, _ in finished], moved, len(n.held), tokens)
            core.update_workers({w: n.info for w, n in nodes.items()})
            todo = deque(core.tick(t))
            while todo:
                c = todo.popleft()
                if isinstance(c, (cmd.ReadInput, cmd.ReadSuperBatchPlan, cmd.CountResults, cmd.LogJob)):
                    todo.extend(storage.answer(core, c))
                elif isinstance(c, cmd.AssignSequences):
                    nodes[c.worker].assign(c.job_id, c.assignments, t)
                elif isinstance(c, cmd.MigrateSequences):
                    self._move(nodes, c, t, out)
            if not core.jobs[job_id].running:
                break
            if t > max_time:
                raise RuntimeError(f"{name}: the job did not finish in {max_time:g} virtual seconds")
            before = {w: n.busy_s for w, n in nodes.items()}
            t += self.tick_s
            for n in nodes.values():
                n.advance(t)
            self._bin(busy_bins, t, sum(n.busy_s - before[w] for w, n in nodes.items()), len(self.specs))
        out.finish_times = sorted(finish_at.values())
        out.bct = out.finish_times[-1] if out.finish_times else 0.0
        out.busy = busy_bins
        return out

    def _move(self, nodes: dict, c: cmd.MigrateSequences, now: float, out: SimOutcome) -> None:
        src, dst = nodes.get(c.source), nodes.get(c.target)
        if src is None or dst is None:
            return  # the command fails in the node too: nothing moves
        taken = src.take(c.job_id, c.target, c.count, c.seq_ids, now)
        link_free = now
        for sid, seq in taken:
            delay, kv = ship_or_reprefill(seq, src.spec, self.link)
            if seq.cached and not kv:
                out.reprefilled += 1
            out.shipped_bytes += kv * src.spec.kv_bytes_per_token
            seq.cached = kv
            link_free += delay  # one link per source: transfers go one after another
            dst.receive(c.job_id, sid, seq, link_free)
        out.moves += 1
        out.moved += len(taken)

    def _bin(self, bins: list, t: float, busy_s: float, workers: int) -> None:
        """Adds a tick's busy worker-seconds to its bin (as a share of the bin's capacity)."""
        i = int((t - 1e-9) // self.bin_s)
        while len(bins) <= i:
            bins.append(0.0)
        bins[i] += busy_s / (workers * self.bin_s)


def run_static(specs: dict[str, WorkerSpec], items: list[dict], bin_s: float = 5.0,
               losses: dict[str, float] | None = None) -> SimOutcome:
    """Items split evenly and contiguously over the workers up front, no moves. A worker
    lost at a time in `losses` takes its unfinished share with it; that share is run
    again from the start, as a failed shard is relaunched, on the worker that finishes
    its own share first."""
    losses = losses or {}
    n = len(specs)
    out = SimOutcome("static", 0.0, ideal_s(items, list(specs.values())), floor_s(items, list(specs.values())),
                     [], [], bin_s)
    start, finish, curves, orphans, done_at = 0, [], [], [], {}
    for i, (w, spec) in enumerate(specs.items()):
        share = items[start:start + len(items) // n + (1 if i < len(items) % n else 0)]
        start += len(share)
        node = SimWorkerNode(w, spec)
        busy = _run_alone(node, share, 0.0, bin_s, until=losses.get(w, FAR))
        if w in losses:
            out.lost_workers += 1
            finished = {sid for sid, t in node.finished.get("job", []) if t <= losses[w]}
            orphans += [it for it in share if it["id"] not in finished]
            node.finish_times = [t for t in node.finish_times if t <= losses[w]]
        else:
            done_at[w] = node.clock
        curves.append(busy)
        finish += node.finish_times
    if orphans:
        if not done_at:
            raise RuntimeError("every worker was lost")
        w = min(done_at, key=done_at.get)
        node = SimWorkerNode(w, specs[w])
        t0 = done_at[w]
        busy = _run_alone(node, orphans, t0, bin_s)
        curves.append([0.0] * int(t0 // bin_s) + busy)
        finish += node.finish_times
    length = max((len(c) for c in curves), default=0)
    out.busy = [sum(c[i] for c in curves if i < len(c)) / (n * bin_s) for i in range(length)]
    out.finish_times = sorted(finish)
    out.bct = out.finish_times[-1] if finish else 0.0
    return out


def _run_alone(node: SimWorkerNode, items: list[dict], t0: float, bin_s: float, until: float = FAR) -> list:
    """Runs `items` on one worker from `t0` until they are done (or `until`); returns its
    busy seconds per bin from `t0`."""
    node.assign("job", [{"seq_id": it["id"], "item": it} for it in items], t0)
    busy, t = [], t0
    while node.held and t < until:
        before = node.busy_s
        t = min(t + bin_s, until)
        node.advance(t)
        busy.append(node.busy_s - before)
    return busy
