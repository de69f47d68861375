"""Where an engine step's time goes: torch.profiler over a few steps, ops by category."""

from __future__ import annotations

import collections
import time

from torch.profiler import ProfilerActivity, profile

CATEGORIES = [
    ("matmul", ("aten::addmm", "aten::mm", "aten::bmm", "mkldnn")),
    ("attention", ("shoal::paged_attention", "scaled_dot_product", "flash_attention", "aten::index_select",
                   "index_copy")),
    ("norm+rope+activation", ("shoal::rms_norm", "shoal::qkv_rope_cache", "shoal::silu_mul")),
    ("sampling", ("aten::topk", "aten::argmax", "aten::sort", "aten::searchsorted")),
]


def category(name: str) -> str:
    for cat, keys in CATEGORIES:
        if any(k in name for k in keys):
            return cat
    return "other ops"


def profile_steps(engine, steps: int) -> dict:
    """Runs `steps` engine steps under the profiler; seconds per category, with
    'python+scheduling' = wall time not spent inside any op."""
    t = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            engine.step()
    wall = time.perf_counter() - t
    by_cat = collections.Counter()
    for ev in prof.key_averages():
        if ev.key.startswith("shoal::"):
            by_cat[category(ev.key)] += ev.cpu_time_total / 1e6  # a record_function: its whole span
        else:
            by_cat[category(ev.key)] += ev.self_cpu_time_total / 1e6
    out = dict(by_cat)
    out["python+scheduling"] = max(0.0, wall - sum(by_cat.values()))
    out["wall"] = wall
    out["steps"] = steps
    return out


def format_breakdown(b: dict) -> str:
    wall = b["wall"]
    parts = [f"{k} {100 * v / wall:.0f}%" for k, v in sorted(b.items(), key=lambda kv: -kv[1]) if k not in ("wall", "steps")]
    return f"{1000 * wall / b['steps']:.0f} ms/step over {b['steps']} steps: " + ", ".join(parts)
