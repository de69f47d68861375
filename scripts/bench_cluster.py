"""W1 through the cluster (router, scheduler, storage, one worker) against the same
engine called in-process, same inputs, same run: the wall time the protocol and the
nodes add (target: under 5%).

Both sides are measured warm: after the first round each engine serves W1's prompts
from its prefix cache (every round sends the same inputs; fresh prompts in a warm
process take as long as the first run, measured 22.4 s then 23.1 s), so a first run
would otherwise be charged to whichever side ran first. The cluster stays up; each
round runs the engine in-process (the idle cluster beside it costs ~2% of this 2-core
machine, see the note printed) and then the same work as a new job. This machine's speed drifts by 10-15% over minutes, so the median of the
per-round ratios is the result. The cold first runs are printed too.

The cost of acknowledged delivery and the durable logs (result WAL with group commit,
job log, input pages, progress reports) is inside that ratio. It is also reported on
its own as CPU: the seconds the storage and scheduler processes burn during a job
beyond what they burn idle (their loops and etcd keep-alives, measured over 15 s
first), as a share of the worker's. On a machine whose cores the worker saturates,
that share bounds the throughput those parts take from generation. The router's share
is printed apart: it is the client's result polling, not delivery.

    python scripts/bench_cluster.py --dtype float32 --sequences 16 --rounds 3
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from workloads import bench_arguments, ensure_model, job_items, w1  # noqa: E402


def main() -> None:
    ap = bench_arguments(__doc__, rounds=3)
    ap.add_argument("--policy", default="mb")
    args = ap.parse_args()
    import shoal
    from shoal.nodes.worker.engine import EngineConfig, LLMEngine
    from shoal.sampling import SamplingParams

    ensure_model(args.model)
    work = w1(sequences=args.sequences)
    items = job_items(work)
    params = {"ignore_eos": True}

    eng = LLMEngine(args.model, EngineConfig(dtype=args.dtype, policy=args.policy))
    sampling = [SamplingParams(max_tokens=n, ignore_eos=True) for n in work.output_lens]
    tokens = work.prompt_tokens + work.output_tokens
    ratios = []

    def in_process() -> float:
        t = time.perf_counter()
        eng.generate(work.prompts, sampling)
        return time.perf_counter() - t

    def cpu_seconds(cluster) -> dict[str, float]:
        import psutil

        out = {}
        for name, (proc, _, _) in cluster.nodes.items():
            t = psutil.Process(proc.pid).cpu_times()
            out[name.split("-")[0]] = out.get(name.split("-")[0], 0.0) + t.user + t.system
        return out

    shares, router_shares, idle = [], [], {}

    def cluster_job(client, cluster, key: str) -> float:
        before = cpu_seconds(cluster)
        t = time.perf_counter()
        results = client.submit(items, params=params, job_key=key).wait()
        assert len(results) == len(items)
        wall = time.perf_counter() - t
        used = {k: v - before[k] - idle.get(k, 0.0) * wall for k, v in cpu_seconds(cluster).items()}
        shares.append((used["storage"] + used["scheduler"]) / used["worker"])
        router_shares.append(used["router"] / used["worker"])
        print(f"  CPU during the job beyond idle: worker {used['worker']:.1f} s, storage {used['storage']:.2f} s, "
              f"scheduler {used['scheduler']:.2f} s, router {used['router']:.2f} s "
              f"-> delivery and logs {100 * shares[-1]:.2f}% of the worker's", flush=True)
        return wall

    cold_inproc = in_process()
    with shoal.LocalCluster(args.model, workers=1, dtype=args.dtype, policy=args.policy) as cluster:
        client = shoal.Client(cluster.router)
        time.sleep(3)
        a = cpu_seconds(cluster)
        time.sleep(15)
        idle.update({k: (v - a[k]) / 15 for k, v in cpu_seconds(cluster).items()})
        print("idle CPU per second: " + ", ".join(f"{k} {1e3 * v:.1f} ms" for k, v in idle.items()), flush=True)
        cold_cluster = cluster_job(client, cluster, "warm-up")
        print(f"cold (first run of a fresh process): in-process {cold_inproc:.1f} s, cluster {cold_cluster:.1f} s", flush=True)
        for r in range(args.rounds):
            inproc = in_process()
            wall = cluster_job(client, cluster, f"round-{r}")
            ratios.append(wall / inproc)
            print(f"round {r + 1}: in-process {inproc:.1f} s ({tokens / inproc:.0f} tok/s), cluster {wall:.1f} s "
                  f"({tokens / wall:.0f} tok/s): {100 * (wall / inproc - 1):+.1f}%", flush=True)
    med = statistics.median(ratios)
    print(f"W1 x{args.sequences} ({args.dtype}, policy {args.policy}), {args.rounds} rounds: nodes and protocol add "
          f"{100 * (med - 1):+.1f}% wall time (median; per round {', '.join(f'{100 * (x - 1):+.1f}%' for x in ratios)})")
    print(f"storage + scheduler CPU beyond idle: {100 * statistics.median(shares):.2f}% of the worker's (median of "
          f"{len(shares)} jobs; a bound on what acknowledgements and the durable logs take); router (client "
          f"polling): {100 * statistics.median(router_shares):.2f}%")

if __name__ == "__main__":
    main()
