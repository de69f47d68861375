"""W1 through the cluster (router, scheduler, storage, one worker) against the same
engine called in-process, same shape of work, same run: the wall time the protocol and
the nodes add (target: under 5%).

Both sides are measured warm, in alternating rounds: the cluster stays up, and each
round runs W1 in-process, then as a new job. Every run gets fresh token ids with W1's
lengths (`GenerationWork.with_fresh_tokens`), so no run is served from the prefix cache
a previous one left. This machine's speed drifts by 10-15% over minutes, so the median
of the per-round ratios is the result; the cold first runs are printed too.

Beside wall time each round prints the CPU seconds each side burned: the in-process
engine's process, and the worker's. Equal CPU seconds with unequal wall time mean the
worker waited (on messages, or on cores the other nodes held); more CPU seconds mean
it did more work for the same tokens. Each side's compute threads also say how long they
were runnable but waiting for a CPU (`/proc/PID/task/*/schedstat`): an engine alone waits
almost none; the worker waits about as long as the other processes (and its own other
threads) ran, since its threads fill every core.

The cost of acknowledged delivery and the durable logs (result WAL with group commit,
job log, input pages, progress reports) is inside that ratio. It is also reported on
its own as CPU: the seconds the storage and scheduler processes burn during a job
beyond what they burn idle (their loops and etcd keep-alives, measured over 15 s
first), as a share of the worker's. On a machine whose cores the worker saturates,
that share bounds the throughput those parts take from generation. The router's share
is printed apart: it is the client's result polling, not delivery.

    python scripts/bench_cluster.py --dtype float32 --sequences 16 --rounds 3

`--pause-others S` measures the other processes' cost a second way, inside one job, so
that the machine's drift between runs drops out (`paused_windows.py`): one more job runs
while every process but the worker (router, scheduler, storage, etcd) is paused and
resumed in turns of S seconds, and each step the worker ran beside them is compared with
its neighbours that ran while they were paused.

    python scripts/bench_cluster.py --sequences 128 --rounds 0 --pause-others 1.5
"""

from __future__ import annotations

import os
import signal
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from cluster_stats import compute_threads, node_cpu_seconds, thread_clocks  # noqa: E402
from paused_windows import running_over_paused  # noqa: E402
from workloads import bench_arguments, ensure_model, job_items, w1  # noqa: E402


def main() -> None:
    ap = bench_arguments(__doc__, rounds=3)
    ap.add_argument("--policy", default="mb")
    ap.add_argument("--pause-others", type=float, default=0.0, metavar="S",
                    help="also run one job pausing and resuming the other nodes every S seconds (0: not)")
    args = ap.parse_args()
    import shoal
    from shoal.nodes.worker.engine import EngineConfig, LLMEngine
    from shoal.sampling import SamplingParams

    ensure_model(args.model)
    work = w1(sequences=args.sequences)
    params = {"ignore_eos": True}

    eng = LLMEngine(args.model, EngineConfig(dtype=args.dtype, policy=args.policy))
    sampling = [SamplingParams(max_tokens=n, ignore_eos=True) for n in work.output_lens]
    tokens = work.prompt_tokens + work.output_tokens
    ratios = []

    def in_process(seed: int) -> tuple[float, float]:
        """Wall and CPU seconds of the in-process engine on fresh tokens."""
        prompts = work.with_fresh_tokens(seed).prompts
        t, c, s = time.perf_counter(), time.process_time(), thread_clocks()
        eng.generate(prompts, sampling)
        wall = time.perf_counter() - t
        print_waits("in-process", compute_threads(s, thread_clocks(), eng.threads), wall)
        return wall, time.process_time() - c

    shares, router_shares, idle = [], [], {}

    def cluster_job(client, cluster, key: str, seed: int) -> tuple[float, float]:
        """Wall seconds of the job and the worker's CPU seconds, on fresh tokens."""
        items = job_items(work.with_fresh_tokens(seed))
        before = node_cpu_seconds(cluster)
        worker_pid = cluster.nodes["worker-0"][0].pid
        sched = thread_clocks(worker_pid)
        t = time.perf_counter()
        results = client.submit(items, params=params, job_key=key).wait()
        assert len(results) == len(items)
        wall = time.perf_counter() - t
        print_waits("the worker", compute_threads(sched, thread_clocks(worker_pid), eng.threads), wall)
        spent = {k: v - before[k] for k, v in node_cpu_seconds(cluster).items()}
        used = {k: v - idle.get(k, 0.0) * wall for k, v in spent.items()}
        shares.append((used["storage"] + used["scheduler"]) / used["worker"])
        router_shares.append(used["router"] / used["worker"])
        print(f"  CPU during the job beyond idle: worker {used['worker']:.1f} s, storage {used['storage']:.2f} s, "
              f"scheduler {used['scheduler']:.2f} s, router {used['router']:.2f} s "
              f"-> delivery and logs {100 * shares[-1]:.2f}% of the worker's", flush=True)
        return wall, spent["worker"]

    cold_inproc = in_process(seed=1)[0] if args.rounds else None
    step_log = Path(tempfile.mkdtemp(prefix="shoal-steps-")) / "steps.log"
    with shoal.LocalCluster(args.model, workers=1, dtype=args.dtype, policy=args.policy,
                            worker_args=["--step-log", str(step_log)]) as cluster:
        client = shoal.Client(cluster.router)
        time.sleep(3)
        a = node_cpu_seconds(cluster)
        time.sleep(15)
        idle.update({k: (v - a[k]) / 15 for k, v in node_cpu_seconds(cluster).items()})
        print("idle CPU per second: " + ", ".join(f"{k} {1e3 * v:.1f} ms" for k, v in idle.items()), flush=True)
        cold_cluster, _ = cluster_job(client, cluster, "warm-up", seed=2)
        if cold_inproc is not None:
            print(f"cold (first run of a fresh process): in-process {cold_inproc:.1f} s, cluster {cold_cluster:.1f} s",
                  flush=True)
        for r in range(args.rounds):
            inproc, inproc_cpu = in_process(seed=3 + 2 * r)
            wall, worker_cpu = cluster_job(client, cluster, f"round-{r}", seed=4 + 2 * r)
            ratios.append(wall / inproc)
            print(f"round {r + 1}: in-process {inproc:.1f} s ({tokens / inproc:.0f} tok/s, {inproc_cpu:.1f} CPU s), "
                  f"cluster {wall:.1f} s ({tokens / wall:.0f} tok/s, worker {worker_cpu:.1f} CPU s): "
                  f"{100 * (wall / inproc - 1):+.1f}%", flush=True)
        if args.pause_others:
            paused_job(client, cluster, step_log, work, args.pause_others)
    if not ratios:
        return
    med = statistics.median(ratios)
    print(f"W1 x{args.sequences} ({args.dtype}, policy {args.policy}), {args.rounds} rounds: nodes and protocol add "
          f"{100 * (med - 1):+.1f}% wall time (median; per round {', '.join(f'{100 * (x - 1):+.1f}%' for x in ratios)})")
    print(f"storage + scheduler CPU beyond idle: {100 * statistics.median(shares):.2f}% of the worker's (median of "
          f"{len(shares)} jobs; a bound on what acknowledgements and the durable logs take); router (client "
          f"polling): {100 * statistics.median(router_shares):.2f}%")


def print_waits(who: str, clocks: dict, wall: float) -> None:
    """What the compute threads' run-queue waits say (`compute_threads`): the other threads'
    and processes' CPU on the engine's cores (each wait also stalls the partner thread at
    its next barrier)."""
    print(f"  {who}'s compute threads: {clocks['compute_cpu']:.1f} s on a CPU, {clocks['compute_wait']:.2f} s "
          f"waiting for one (runnable, preempted), scheduled in {clocks['compute_runs'] / wall:.0f} times a second",
          flush=True)


def paused_job(client, cluster, step_log: Path, work, every: float) -> None:
    """One more job on fresh tokens, the other nodes paused and resumed in turns of
    `every` seconds; prints what running beside them cost the worker's steps."""
    others = [proc.pid for name, (proc, _, _) in cluster.nodes.items() if not name.startswith("worker")]
    others.append(cluster.etcd.proc.pid)
    flips: list[tuple[float, bool]] = []
    done = threading.Event()

    def pause(paused: bool) -> None:
        for pid in others:
            os.kill(pid, signal.SIGSTOP if paused else signal.SIGCONT)
        flips.append((time.time(), paused))

    def turns() -> None:
        paused = False
        try:
            while not done.wait(every):
                paused = not paused
                pause(paused)
        finally:
            pause(False)  # never leave a node stopped

    start = len(step_log.read_text().splitlines()) if step_log.exists() else 0
    job = client.submit(job_items(work.with_fresh_tokens(99)), params={"ignore_eos": True}, job_key="paused")
    flipper = threading.Thread(target=turns, daemon=True)
    flipper.start()
    try:
        results = job.wait()
    finally:
        done.set()
        flipper.join()
    assert len(results) == len(work.prompts)
    steps = [tuple(map(float, line.split())) for line in step_log.read_text().splitlines()[start:]]
    # The first steps are long prefill steps that straddle every flip: left out.
    ratios = running_over_paused(steps, flips, skip=8)
    if not ratios:
        print("pause-others: no step ran wholly inside a window; use a longer --pause-others")
        return
    q = statistics.quantiles(ratios, n=4) if len(ratios) > 3 else ratios
    print(f"pause-others ({every:g} s turns, {len(steps)} steps): a step beside the running nodes took "
          f"{100 * (statistics.median(ratios) - 1):+.1f}% against its neighbours while they were paused "
          f"(median of {len(ratios)}; quartiles {100 * (q[0] - 1):+.1f}%, {100 * (q[-1] - 1):+.1f}%)")


if __name__ == "__main__":
    main()
