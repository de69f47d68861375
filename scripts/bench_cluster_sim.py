"""Batch completion time at cluster scale, simulated: Shoal's scheduler core against
static partitioning, on heavy-tailed workloads.

Every side runs the same simulated workers (the engine's real step planner, a step-time
model from a published calibration; `scheduler/sim/sim_worker_node.py`) on a virtual clock:

- shoal: the scheduler core (`scheduler/core.py`, the code the scheduler node runs):
  items read in pages as workers have room, placed by speed, work stealing, moves with
  their KV shipped over the link or re-prefilled, whichever is cheaper;
- shoal-no-moves: the same without stealing;
- static: what a data-parallel launch does — the items split evenly and contiguously up
  front, each worker running its share, no moves.

The ideal is the total work divided over the workers (each priced at its full batch).
Prints, per workload, each side's batch completion time, its ratio to the ideal and to
static, the time of the last 5% of items and the mean utilization; writes a PNG of the
utilization over time when matplotlib is installed.

    python scripts/bench_cluster_sim.py --hetero --loss  # 128 H200 workers (and mixes)
    python scripts/bench_cluster_sim.py --workers 16 --items-per-worker 64
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path

from shoal.scheduler.sim import sim_workloads as wl
from shoal.scheduler.sim.cluster_sim import ClusterSim, SimOutcome, run_static
from shoal.scheduler.cost_model import H200_QWEN3_8B, RTX6000_QWEN3_8B
from shoal.scheduler.sim.sim_worker_node import WorkerSpec

H200 = WorkerSpec(H200_QWEN3_8B, r_star=0.8, max_seqs=256, kv_blocks=53_000)  # ~125 GB of KV after 16 GB of weights
RTX6000 = WorkerSpec(RTX6000_QWEN3_8B, r_star=0.2, max_seqs=256, kv_blocks=33_000)  # 96 GB card


def workloads(n: int, seed: int) -> dict[str, list[dict]]:
    return {
        "uniform": wl.uniform(n, seed),
        "lognormal": wl.lognormal(n, seed),
        "bimodal": wl.bimodal(n, seed),
        "multi-hop": wl.multi_hop(n, seed),
        "sorted-lognormal": wl.sorted_by_length(wl.lognormal(n, seed)),
        # Not a real submission: the lengths known in advance, the longest started first.
        "oracle-lognormal": wl.longest_first(wl.lognormal(n, seed)),
    }


def run_workload(name: str, items: list[dict], specs: dict, args, losses: dict | None = None) -> list[SimOutcome]:
    link = args.link_gbps * 1e9 / 8
    sims = [("static", lambda: run_static(specs, items, losses=losses)),
            ("shoal", lambda: ClusterSim(specs, link_bytes_per_s=link, losses=losses).run(items, "shoal")),
            ("shoal-no-moves", lambda: ClusterSim(specs, link_bytes_per_s=link, moves=False, losses=losses)
             .run(items, "shoal-no-moves"))]
    out = []
    for side, sim in sims:
        t = time.perf_counter()
        r = sim()
        r.notes["sim_s"] = time.perf_counter() - t
        out.append(r)
    static = out[0]
    print(f"\n{name}: {len(items)} items, ideal {static.ideal:.1f} s (total work / workers), "
          f"floor {static.floor:.1f} s (the longest item alone)")
    for r in out:
        print(f"  {r.name:>15}: {r.bct:8.1f} s  {r.vs_ideal:5.2f}x ideal  static/this {static.bct / r.bct:5.2f}x  "
              f"last 5% {r.tail_s:7.1f} s  utilization {100 * r.utilization:3.0f}%  moves {r.moves} ({r.moved} seqs, "
              f"{r.shipped_bytes / 1e9:.1f} GB shipped, {r.reprefilled} re-prefilled)  [sim {r.notes['sim_s']:.1f} s]")
    return out


def plot(results: dict[str, list[SimOutcome]], path: str) -> None:
    from plots import pyplot

    plt = pyplot()
    if plt is None:
        print(f"(no plot: matplotlib is not installed; pip install matplotlib, then run again for {path})")
        return
    fig, axes = plt.subplots(len(results), 1, figsize=(9, 2.4 * len(results)), squeeze=False)
    for ax, (name, outs) in zip(axes[:, 0], results.items()):
        for r in outs:
            # (a step is counted in the tick it starts in, so a bin can read a little over 100%)
            ax.plot([r.bin_s * (i + 0.5) for i in range(len(r.busy))], [min(100.0, 100 * b) for b in r.busy],
                    label=f"{r.name} ({r.bct:.0f} s)")
        ax.set_title(name, fontsize=9)
        ax.set_ylabel("busy %")
        ax.set_ylim(0, 105)
        ax.legend(fontsize=7, loc="lower left")
    axes[-1, 0].set_xlabel("virtual seconds")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"utilization over time: {path}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workers", type=int, default=128)
    ap.add_argument("--items-per-worker", type=int, default=256)
    ap.add_argument("--only", default="", help="comma-separated workload names")
    ap.add_argument("--hetero", action="store_true", help="also half H200, half RTX PRO 6000 on the lognormal workload")
    ap.add_argument("--loss", action="store_true", help="also the lognormal workload with a worker lost halfway")
    ap.add_argument("--link-gbps", type=float, default=200.0, help="per-worker link for KV moves (Gbit/s)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--png", default="cluster_sim.png")
    ap.add_argument("--json")
    args = ap.parse_args()
    logging.getLogger("shoal.scheduler.core").setLevel(logging.ERROR)  # a lost worker's warnings, once per run
    n = args.workers * args.items_per_worker
    specs = {f"w{i:03d}": H200 for i in range(args.workers)}
    print(f"{args.workers} simulated H200 workers (Qwen3-8B calibration, 256 sequences per step), "
          f"{args.items_per_worker} items per worker, KV moves over {args.link_gbps:g} Gbit/s")
    wanted = set(filter(None, args.only.split(",")))
    results = {}
    for name, items in workloads(n, args.seed).items():
        if wanted and name not in wanted:
            continue
        results[name] = run_workload(name, items, specs, args)
    if args.loss:
        items = wl.lognormal(n, args.seed)
        at = run_static(specs, items).ideal / 2
        results["lognormal, a worker lost"] = run_workload(
            f"lognormal, one worker lost (kill -9) at {at:.0f} s", items, specs, args, losses={"w000": at})
    if args.hetero:
        mixed = {w: (H200 if i % 2 == 0 else RTX6000) for i, w in enumerate(specs)}
        results["lognormal, H200 + RTX PRO 6000"] = run_workload(
            "lognormal, half H200 and half RTX PRO 6000", wl.lognormal(n, args.seed), mixed, args)
    plot(results, args.png)
    if args.json:
        Path(args.json).write_text(json.dumps({name: [{"name": r.name, "bct": r.bct, "ideal": r.ideal,
                                                        "tail_s": r.tail_s, "utilization": r.utilization,
                                                        "moves": r.moves, "moved": r.moved}
                                                       for r in outs] for name, outs in results.items()}, indent=2))


if __name__ == "__main__":
    main()
