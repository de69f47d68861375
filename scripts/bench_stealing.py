"""Work stealing on a skewed start: W1 on 2 workers with every sequence first placed
on one of them, with and without stealing.

Each variant is a local cluster of 2 warm workers (one torch thread each, so the two
share this 2-core machine evenly). The job is submitted and at once all of its
sequences are moved to worker-0 (`Client.migrate`), which is the skew; without
stealing worker-1 then idles, with it the scheduler moves half of them back as soon
as nothing is waiting to be placed. Reported: batch completion time of each, rounds
interleaved.

    python scripts/bench_stealing.py --sequences 16 --rounds 2
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from workloads import bench_arguments, ensure_model, job_items, w1  # noqa: E402


def main() -> None:
    ap = bench_arguments(__doc__)
    args = ap.parse_args()
    import shoal
    from shoal.transport.rpc import RpcClient

    ensure_model(args.model)
    work = w1(sequences=args.sequences)
    items = job_items(work)
    variants = {"stealing": [], "no stealing": ["--no-steal"]}
    clusters, walls = {}, {v: [] for v in variants}
    try:
        for name, sched in variants.items():
            clusters[name] = shoal.LocalCluster(args.model, workers=2, dtype=args.dtype, policy="mb", worker_threads=1,
                                                cluster=name.replace(" ", "-"), scheduler_args=sched).start()

        def run(name: str, key: str, skew: bool) -> float:
            client = shoal.Client(clusters[name].router)
            t = time.perf_counter()
            job = client.submit(items, params={"ignore_eos": True}, job_key=key)
            while skew and not client.migrate(job.id, "worker-0")["moving"]:
                time.sleep(0.05)  # until the scheduler has placed them
            assert len(job.wait()) == len(items)
            return time.perf_counter() - t

        for name in variants:
            run(name, "warm-up", skew=False)
        for r in range(args.rounds):
            for name in (list(variants) if r % 2 == 0 else list(variants)[::-1]):
                walls[name].append(run(name, f"round-{r}", skew=True))
                print(f"round {r + 1}, {name}: {walls[name][-1]:.1f} s", flush=True)
        moved = {name: sum(RpcClient(c.nodes[w][2]).request("StatsQuery")["stats"]["counters"].get(
            "sequences.imported", 0) for w in ("worker-0", "worker-1")) for name, c in clusters.items()}
    finally:
        for c in clusters.values():
            c.stop()
    s, n = statistics.median(walls["stealing"]), statistics.median(walls["no stealing"])
    print(f"W1 x{args.sequences} skewed onto one of 2 workers, median of {args.rounds}: with stealing {s:.1f} s, "
          f"without {n:.1f} s ({n / s:.2f}x); sequences moved: {moved}")


if __name__ == "__main__":
    main()
