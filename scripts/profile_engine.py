"""Where a step's time goes: torch.profiler over engine steps of W1, ops by category.

    python scripts/profile_engine.py --dtype float32 --sequences 32 --steps 30
"""

from __future__ import annotations

import argparse
import collections
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

from workloads import w1  # noqa: E402

CATEGORIES = [
    ("matmul", ("aten::addmm", "aten::mm", "aten::linear", "aten::matmul", "aten::bmm", "mkldnn")),
    ("attention", ("scaled_dot_product", "flash_attention", "aten::index", "index_copy", "aten::_softmax", "aten::baddbmm")),
]


def category(name: str) -> str:
    for cat, keys in CATEGORIES:
        if any(k in name for k in keys):
            return cat
    if "topk" in name or "argmax" in name or "sort" in name:
        return "sampling"
    return "other ops"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=".bench/model-small")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--sequences", type=int, default=32)
    ap.add_argument("--warm", type=int, default=20, help="steps before profiling (prefill done)")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--budget", type=int, default=512)
    args = ap.parse_args()
    from shoal.nodes.worker.engine import EngineConfig, LLMEngine
    from shoal.sampling import SamplingParams

    work = w1(sequences=args.sequences)
    eng = LLMEngine(args.model, EngineConfig(dtype=args.dtype, max_num_batched_tokens=args.budget))
    for i, (p, n) in enumerate(zip(work.prompts, work.output_lens)):
        eng.add_request(i, prompt_token_ids=p, params=SamplingParams(max_tokens=n, ignore_eos=True))
    for _ in range(args.warm):
        eng.step()
    t = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(args.steps):
            eng.step()
    wall = time.perf_counter() - t
    by_cat = collections.Counter()
    top = []
    for ev in prof.key_averages():
        by_cat[category(ev.key)] += ev.self_cpu_time_total / 1e6
        top.append((ev.self_cpu_time_total / 1e6, ev.key, ev.count))
    print(f"{args.steps} steps in {wall:.2f} s ({1000 * wall / args.steps:.0f} ms/step; profiler overhead included)")
    for cat, sec in by_cat.most_common():
        print(f"  {cat:>10}: {sec:6.2f} s  {100 * sec / wall:5.1f}%")
    print(f"  {'python+sched':>10}: {wall - sum(by_cat.values()):6.2f} s (wall minus op self time)")
    for sec, key, count in sorted(top, reverse=True)[:15]:
        print(f"    {sec:6.3f} s  {count:6d}x  {key}")


if __name__ == "__main__":
    main()
