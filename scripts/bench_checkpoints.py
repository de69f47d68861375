"""The throughput cost of sequence checkpoints on W1 (target: under 3%).

One local cluster per checkpoint interval, all up at once (so each is measured beside
the others' idle cost), each warmed with one job, then the same W1 job on each in
interleaved rounds (order reversed every round: this machine drifts by 10-15% over
minutes). Reported: wall time per interval and its ratio to no in-operation
checkpoints (interval 0: W1 is one Generate per item, so 0 means none at all), and
the checkpoints storage kept.

W1's outputs are 128-256 tokens, so the default interval (256) takes at most one per
sequence; 64 and 16 show what denser checkpoints cost.

    python scripts/bench_checkpoints.py --intervals 0,64,16 --sequences 16 --rounds 2
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
    ap.add_argument("--intervals", default="0,64,16")
    args = ap.parse_args()
    import shoal
    from shoal.transport.rpc import RpcClient

    ensure_model(args.model)
    work = w1(sequences=args.sequences)
    items = job_items(work)
    tokens = work.prompt_tokens + work.output_tokens
    intervals = [int(x) for x in args.intervals.split(",")]
    clusters = {}
    try:
        for k in intervals:
            clusters[k] = shoal.LocalCluster(args.model, workers=1, dtype=args.dtype, policy="mb", cluster=f"ckpt-{k}",
                                             worker_args=["--checkpoint-tokens", str(k)]).start()
        walls: dict[int, list[float]] = {k: [] for k in intervals}

        def run(k: int, key: str) -> float:
            t = time.perf_counter()
            results = shoal.Client(clusters[k].router).submit(items, params={"ignore_eos": True}, job_key=key).wait()
            assert len(results) == len(items)
            return time.perf_counter() - t

        for k in intervals:
            run(k, "warm-up")
        for r in range(args.rounds):
            for k in (intervals if r % 2 == 0 else intervals[::-1]):
                walls[k].append(run(k, f"round-{r}"))
                print(f"round {r + 1}, interval {k}: {walls[k][-1]:.1f} s ({tokens / walls[k][-1]:.0f} tok/s)", flush=True)
        kept = {k: RpcClient(c.nodes["storage-0"][2]).request("StatsQuery")["stats"]["counters"].get("checkpoints.kept", 0)
                for k, c in clusters.items()}
        spent = {k: RpcClient(c.nodes["worker-0"][2]).request("StatsQuery")["stats"].get("checkpoint_s", 0.0)
                 for k, c in clusters.items()}
    finally:
        for c in clusters.values():
            c.stop()
    base = statistics.median(walls[intervals[0]])
    print(f"W1 x{args.sequences} ({args.dtype}), {args.rounds} rounds, median wall time per checkpoint interval:")
    for k in intervals:
        med = statistics.median(walls[k])
        label = f"every {k} tokens" if k else "none inside an operation"
        print(f"  {label}: {med:.1f} s, {100 * (med / base - 1):+.1f}% vs interval {intervals[0]}; "
              f"{kept[k]} checkpoints kept by storage over {args.rounds + 1} jobs; the compute thread spent "
              f"{spent[k]:.2f} s taking them ({100 * spent[k] / sum(walls[k]) * args.rounds / (args.rounds + 1):.2f}% "
              "of its time)")


if __name__ == "__main__":
    main()
