"""Where a local cluster's extra time goes: W1 in-process and through a local cluster,
with what the kernel says of the engine's compute threads over the job (CPU time, time
waiting for a core, times scheduled: /proc/<pid>/task/*/schedstat) and the CPU every
other process of the cluster spent meanwhile.

    python scripts/bench_cluster_cost.py                 # the engine on every core
    python scripts/bench_cluster_cost.py --threads 1     # the engine on one, the rest free

Each side runs its warm-up job first (the cluster's worker also calibrates), then the
measured one, the same shape with fresh token ids; the sides alternate, A B then B A, and
the comparisons are medians over rounds. With the engine on fewer threads than the
machine has cores, the router, scheduler, storage and etcd run on cores of their own, as
on a GPU host: what is left of the difference is the cluster's own path (placement,
messages, results). With the engine on every core, they take their CPU from it: its
threads wait for a core, and while one waits, the others spin at the next barrier.
(`bench_cluster.py` runs its in-process rounds beside the idle cluster instead: it weighs
the job's own traffic, delivery and logs, not the cluster's whole cost.)
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from cluster_stats import compute_threads, node_cpu_seconds, thread_clocks  # noqa: E402
from turned_rounds import format_ratio, per_round, run_rounds  # noqa: E402
from workloads import bench_arguments, ensure_model, job_items, w1  # noqa: E402

# The in-process side in a fresh interpreter, so that its threads are the engine's own.
# It answers "ready" after its warm-up job, runs the measured job on a line from stdin
# and prints the job's seconds.
ENGINE_ALONE = r"""
import sys, time
sys.path.insert(0, sys.argv[1])
from workloads import w1
from shoal.nodes.worker.engine import EngineConfig, LLMEngine
from shoal.sampling import SamplingParams

model, dtype, threads, sequences = sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
eng = LLMEngine(model, EngineConfig(dtype=dtype, num_threads=threads))
work = w1(sequences=sequences)

def run(seed):
    w = work.with_fresh_tokens(seed)
    t = time.perf_counter()
    eng.generate(w.prompts, [SamplingParams(max_tokens=n, ignore_eos=True) for n in w.output_lens])
    return time.perf_counter() - t

run(1)
print("ready", flush=True)
sys.stdin.readline()
print(run(2), flush=True)
sys.stdin.readline()
"""


def run_alone(args) -> dict:
    proc = subprocess.Popen([sys.executable, "-c", ENGINE_ALONE, str(HERE), args.model, args.dtype, str(args.threads),
                             str(args.sequences)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        if proc.stdout.readline().strip() != "ready":
            raise RuntimeError(f"the engine alone did not start (exit {proc.wait()})")
        before = thread_clocks(proc.pid)
        proc.stdin.write("\n")
        proc.stdin.flush()
        wall = float(proc.stdout.readline())
        after = thread_clocks(proc.pid)
        proc.stdin.write("\n")
        proc.stdin.flush()
    finally:
        proc.wait(60)
    return {"wall": wall, **compute_threads(before, after, args.threads), "others": {}}


def run_cluster(args) -> dict:
    import shoal

    work = w1(sequences=args.sequences)
    with shoal.LocalCluster(args.model, workers=1, dtype=args.dtype, worker_threads=args.threads) as cluster:
        client = shoal.Client(cluster.router)
        client.submit(job_items(work.with_fresh_tokens(1)), params={"ignore_eos": True}, job_key="warm-up").wait()
        worker = cluster.nodes["worker-0"][0].pid
        before, nodes_before, client_before = thread_clocks(worker), node_cpu_seconds(cluster), time.process_time()
        t = time.perf_counter()
        results = client.submit(job_items(work.with_fresh_tokens(2)), params={"ignore_eos": True},
                                job_key="measured").wait()
        wall = time.perf_counter() - t
        after, nodes_after, client_after = thread_clocks(worker), node_cpu_seconds(cluster), time.process_time()
        client.close()
    failed = [r for r in results if r.get("error")]
    if failed:
        raise RuntimeError(f"{len(failed)} items failed, e.g. {failed[0]}")
    others = {role: nodes_after[role] - nodes_before[role] for role in nodes_after if role != "worker"}
    others["client"] = client_after - client_before
    return {"wall": wall, **compute_threads(before, after, args.threads), "others": others}


def describe(name: str, r: dict) -> str:
    line = (f"{name:>13s}: {r['wall']:6.2f} s; compute threads ran {r['compute_cpu']:6.2f} s, "
            f"waited {r['compute_wait']:5.2f} s for a core, scheduled {r['compute_runs']:6d} times; "
            f"the process's other threads {r['other_threads_cpu']:.2f} s")
    if r["others"]:
        line += "\n" + " " * 15 + "other processes' CPU: " + ", ".join(
            f"{n} {s:.2f} s" for n, s in sorted(r["others"].items(), key=lambda kv: -kv[1]))
        line += f" ({sum(r['others'].values()):.2f} s in all)"
    return line


def main() -> None:
    ap = bench_arguments(__doc__, sequences=128, rounds=2)
    ap.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)),
                    help="the engine's threads (default: every core this process may use)")
    args = ap.parse_args()
    ensure_model(args.model)
    print(f"CPU: {os.cpu_count()} cores; the engine on {args.threads} threads; W1 with {args.sequences} sequences, "
          f"dtype {args.dtype}", flush=True)

    def run_one(name: str, _round: int) -> dict:
        r = run_alone(args) if name == "in-process" else run_cluster(args)
        print(describe(name, r), flush=True)
        return r

    rounds = run_rounds(["in-process", "local cluster"], args.rounds, run_one)
    for label, key in (("wall time", "wall"), ("compute threads' CPU", "compute_cpu")):
        ratios = per_round(rounds, "local cluster", "in-process", lambda c, a, k=key: c[k] / a[k] - 1)
        print(f"local cluster vs in-process, {label}: {format_ratio(ratios, '%')}")
    waits = [r["local cluster"]["compute_wait"] - r["in-process"]["compute_wait"] for r in rounds
             if "local cluster" in r and "in-process" in r]
    if waits:
        print(f"compute threads' extra wait for a core: {statistics.median(waits):.2f} s (median)")


if __name__ == "__main__":
    main()
