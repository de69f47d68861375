"""W4: MB, EB and EB+ on the real engine under non-stationary
traffic, each phase's throughput per policy, and which mode EB+ chose when.

The paper's traces, scaled down for a CPU: the distribution shift (1024,128) → (512,512)
→ (128,1024) and the concurrency shift 32 → 512 → 1024 → 256 → 2048, lengths and
concurrency divided by --scale. Before running, it prints the calibrated cost model and
the side of the crossover (Prop. 4) it predicts for each phase.

    python scripts/bench_policies.py --trace shift --policy mb,eb,ebplus
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from shoal.scheduler import eb_math  # noqa: E402
from shoal.scheduler.sim.simulator import synthetic_requests  # noqa: E402


def trace(name: str, scale: int, per_phase: int, seed: int = 0):
    """[(label, requests, concurrency)]"""
    if name == "shift":
        phases = [(1024, 128), (512, 512), (128, 1024)]
        conc = max(2, 256 // scale)
        return [(f"({mp // scale},{mo // scale})@{conc}", synthetic_requests(per_phase, mp // scale, mo // scale, seed=seed + i), conc)
                for i, (mp, mo) in enumerate(phases)]
    if name == "concurrency":
        levels = [32, 512, 1024, 256, 2048]
        out = []
        for i, c in enumerate(levels):
            cc = max(1, c // scale)
            out.append((f"(512,512)/{scale}@{cc}", synthetic_requests(max(per_phase // 4, 2 * cc), 512 // scale, 512 // scale, seed=seed + i), cc))
        return out
    raise SystemExit(f"unknown trace {name!r}")


def predicted_sides(cm, phases) -> list[tuple[str, float, float, str]]:
    """Per phase, the crossover condition's two sides (Prop. 4) from the calibration
    alone, and the mode it says wins."""
    out = []
    for label, reqs, conc in phases:
        mp = sum(q.prompt_len for q in reqs) / len(reqs)
        mo = sum(q.output_len for q in reqs) / len(reqs)
        th = eb_math.clamp_theta(eb_math.asymptotic_threshold(eb_math.hazard_rate(1 / mo), cm))
        k = max(1, int(th * conc))
        lhs, rhs = eb_math.crossover(cm, mp, mo, th, k, conc)
        out.append((label, lhs, rhs, "EB" if lhs > rhs + 1e-5 else "MB" if lhs < rhs - 1e-5 else "either (within δ)"))
    return out


def run(engine, phases):
    """Closed loop over the phases; per phase: tokens computed and seconds."""
    queue = [(i, req, conc) for i, (_, reqs, conc) in enumerate(phases) for req in reqs]
    pos = in_flight = 0
    next_id = 0
    cur = 0
    per = [{"tokens": 0, "time": 0.0, "modes": {}} for _ in phases]
    import random

    r = random.Random(7)
    from shoal.sampling import SamplingParams

    vocab = engine.model_cfg.vocab_size - 1
    start = time.perf_counter()
    while pos < len(queue) or in_flight:
        while pos < len(queue) and in_flight < queue[pos][2]:
            i, req, _ = queue[pos]
            cur = i
            engine.add_request(next_id, prompt_token_ids=[r.randrange(vocab) for _ in range(req.prompt_len)],
                               params=SamplingParams(max_tokens=req.output_len, ignore_eos=True))
            next_id += 1
            pos += 1
            in_flight += 1
        before_tokens = engine.stats.prompt_tokens_computed + engine.stats.generated_tokens
        mode = engine.planner.stats().get("mode", "mb")
        t = time.perf_counter()
        in_flight -= len(engine.step())
        dt = time.perf_counter() - t
        p = per[cur]
        p["tokens"] += engine.stats.prompt_tokens_computed + engine.stats.generated_tokens - before_tokens
        p["time"] += dt
        p["modes"][mode] = p["modes"].get(mode, 0.0) + dt
    total = time.perf_counter() - start
    return per, total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=".bench/model-small")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--trace", default="shift", choices=["shift", "concurrency"])
    ap.add_argument("--scale", type=int, default=8)
    ap.add_argument("--per-phase", type=int, default=64)
    ap.add_argument("--policy", default="mb,eb,ebplus")
    ap.add_argument("--budget", type=int, default=None, help="default: from the device calibration")
    ap.add_argument("--json")
    args = ap.parse_args()
    from shoal.nodes.worker.engine import EngineConfig, LLMEngine

    if not Path(args.model, "config.json").exists():
        from shoal.nodes.worker.models.make_model import make_model

        make_model(args.model, preset="small", dtype="bfloat16")
    phases = trace(args.trace, args.scale, args.per_phase)
    results = {}
    for policy in args.policy.split(","):
        engine = LLMEngine(args.model, EngineConfig(dtype=args.dtype, policy=policy, max_num_batched_tokens=args.budget))
        if policy != "mb" and engine.policy_fallback:
            print(f"{policy}: fell back to MB: {engine.policy_fallback}")
        cm = engine.cost_model
        if cm is not None and "cost" not in results:
            results["cost"] = cm.to_dict()
            print(f"calibration ({cm.device}, {cm.dtype}): α_p {cm.alpha_p * 1e3:.1f} ms  β_p {cm.beta_p * 1e6:.0f} µs/tok  "
                  f"α_d {cm.alpha_d * 1e3:.1f} ms  β_d {cm.beta_d * 1e6:.0f} µs/seq  "
                  f"β_MB(r) = {cm.mb_a * 1e6:.0f} + {cm.mb_b * 1e6:.0f}r + {cm.mb_c * 1e6:.0f}r² µs/tok  R² {cm.r2}")
            for label, lhs, rhs, side in predicted_sides(cm, phases):
                print(f"  predicted {label}: LHS {lhs:.2e}  RHS {rhs:.2e}  -> {side}")
        per, total = run(engine, phases)
        results[policy] = {"phases": per, "total_time": total,
                           "switches": list(getattr(engine.planner, "switches", []))}
        tok = sum(p["tokens"] for p in per)
        print(f"{policy:>7}: {tok / total:7.1f} tok/s overall ({total:.1f} s)  " + "  ".join(
            f"{label}: {p['tokens'] / p['time']:.1f}" for (label, _, _), p in zip(phases, per)))
        if policy == "ebplus":
            for (label, _, _), p in zip(phases, per):
                share = {m: f"{100 * t / p['time']:.0f}%" for m, t in p["modes"].items()}
                print(f"         EB+ modes in {label}: {share}")
            print(f"         EB+ switches (completion, mode): {results[policy]['switches']}")
    pols = [p for p in args.policy.split(",") if p in results]
    if {"mb", "eb", "ebplus"} <= set(pols):
        for i, (label, _, _) in enumerate(phases):
            tp = {p: results[p]["phases"][i]["tokens"] / results[p]["phases"][i]["time"] for p in ("mb", "eb", "ebplus")}
            print(f"  {label}: EB+/best pure = {tp['ebplus'] / max(tp['mb'], tp['eb']):.3f}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2, default=str))


if __name__ == "__main__":
    main()
