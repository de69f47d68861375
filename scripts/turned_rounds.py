"""Benchmark rounds against a machine whose speed drifts: every system runs once a
round, in an order that turns around every round (A B C, then C B A, ...), and a
comparison is the median of its per-round ratios."""

from __future__ import annotations

import statistics


def run_rounds(names: list[str], rounds: int, run_one) -> list[dict]:
    """`run_one(name, round)` for every name, `rounds` times; each round's {name:
    figures} of the runs that returned figures (None: that run failed)."""
    out = []
    for rnd in range(rounds):
        if rounds > 1:
            print(f"-- round {rnd + 1} of {rounds}", flush=True)
        order = names if rnd % 2 == 0 else names[::-1]
        out.append({name: r for name in order if (r := run_one(name, rnd)) is not None})
    return out


def per_round(rounds: list[dict], a: str, b: str, ratio) -> list[float]:
    """ratio(a's figures, b's figures) in each round where both ran."""
    return [ratio(r[a], r[b]) for r in rounds if a in r and b in r]


def format_ratio(values: list[float], unit: str) -> str:
    """One round's ratio, or the median of several with each round's; unit "x" or "%"."""
    fmt = (lambda v: f"{v:.2f}x") if unit == "x" else (lambda v: f"{100 * v:+.1f}%")
    if len(values) == 1:
        return fmt(values[0])
    return f"{fmt(statistics.median(values))} (median of {len(values)} rounds: {', '.join(map(fmt, values))})"
