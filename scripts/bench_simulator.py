"""MB, EB and EB+ in the virtual-clock simulator with the published Qwen3-8B
calibrations (EB+): the paper's synthetic cells, its non-stationary traces,
and a sweep of the interference term (r*, the decode share where a mixed step's
marginal cost reaches pure decode's) around the paper's values.

    python scripts/bench_simulator.py                 # cells + traces at the paper's r*
    python scripts/bench_simulator.py --sweep         # directions over a range of r*
"""

from __future__ import annotations

import argparse

from shoal.scheduler.adaptive_planner import AdaptivePlanner
from shoal.scheduler.cost_model import H200_QWEN3_8B, RTX6000_QWEN3_8B
from shoal.scheduler.exclusive_planner import ExclusiveBatchPlanner
from shoal.scheduler.sim.simulator import StepTimeModel, simulate
from shoal.scheduler.step_planner import MixedBatchPlanner, PlannerConfig
from shoal.scheduler.sim.traces import CELLS, cell, concurrency_shift, distribution_shift

DEVICES = {"H200": (H200_QWEN3_8B, 0.8), "RTX PRO 6000": (RTX6000_QWEN3_8B, 0.2)}
BLOCKS = 40_000  # ~640K tokens of KV: an 8B model's cache on either card


def run(cm, r_star, phases, max_seqs, steady):
    cfg = PlannerConfig(block_size=16, max_num_batched_tokens=8192, max_num_seqs=max_seqs, num_blocks=BLOCKS)
    tm = StepTimeModel(cm, r_star)
    out = {}
    for name, planner in (("mb", MixedBatchPlanner(cfg)), ("eb", ExclusiveBatchPlanner(cfg, cm)),
                          ("ebplus", AdaptivePlanner(cfg, cm))):
        res = simulate(planner, tm, phases, BLOCKS)
        out[name] = (res.steady_throughput if steady else res.throughput, res)
    return out


def line(label, out):
    t = {k: v[0] for k, v in out.items()}
    best = max(t["mb"], t["eb"])
    modes = out["ebplus"][1].mode_time
    share = ", ".join(f"{m} {100 * s / sum(modes.values()):.0f}%" for m, s in modes.items())
    print(f"{label:<44} MB {t['mb']:8.0f}  EB {t['eb']:8.0f}  EB+ {t['ebplus']:8.0f} tok/s   "
          f"EB/MB {t['eb'] / t['mb']:.3f}  EB+/best {t['ebplus'] / best:.3f}  EB+/MB {t['ebplus'] / t['mb']:.3f}  [EB+ time: {share}]")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=1024)
    ap.add_argument("--concurrency", type=int, default=256)
    ap.add_argument("--sweep", action="store_true")
    args = ap.parse_args()
    for dev, (cm, paper_r) in DEVICES.items():
        rs = [paper_r * f for f in (0.75, 1.0, 1.125)] if args.sweep else [paper_r]
        for r_star in rs:
            g = StepTimeModel(cm, r_star).gamma
            print(f"== {dev}: r* = {r_star:.2f} (γ = {g * 1e6:.1f} µs per decode in a mixed step)")
            for name in CELLS:
                line(f"{name} (steady state, concurrency {args.concurrency})",
                     run(cm, r_star, cell(name, args.requests, args.concurrency), args.concurrency, True))
            if not args.sweep:
                line("distribution shift (whole job)",
                     run(cm, r_star, distribution_shift(args.requests // 2, args.concurrency), args.concurrency, False))
                line("concurrency shift 32-512-1024-256-2048 (whole job)",
                     run(cm, r_star, concurrency_shift(0.5), 2048, False))


if __name__ == "__main__":
    main()
