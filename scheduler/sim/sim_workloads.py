"""Workloads for the cluster simulator: items of `SimWorkerNode`'s shape, from a seed.

Each item is `{"id", "segments": [[new_prompt_tokens, output_tokens], ...], "pause_s"}`.
The heavy tails are the point: a few items much longer than the rest decide when a
statically split job ends.
"""

from __future__ import annotations

import math
import random


def _item(i: int, segments: list, pause_s: float = 0.0) -> dict:
    return {"id": i, "segments": segments, "pause_s": pause_s}


def uniform(n: int, seed: int = 0, prompt=(200, 600), output=(200, 400)) -> list[dict]:
    r = random.Random(seed)
    return [_item(i, [[r.randint(*prompt), r.randint(*output)]]) for i in range(n)]


def lognormal(n: int, seed: int = 0, median: int = 256, sigma: float = 1.5, cap: int = 4096,
              prompt=(200, 600)) -> list[dict]:
    """Output lengths log-normal (median `median`, shape `sigma`), capped at `cap`."""
    r = random.Random(seed)
    return [_item(i, [[r.randint(*prompt), max(1, min(cap, int(r.lognormvariate(math.log(median), sigma))))]])
            for i in range(n)]


def bimodal(n: int, seed: int = 0, long_share: float = 0.05, short=(32, 256), long=(1024, 4096),
            prompt=(200, 600)) -> list[dict]:
    """Most outputs short, a few very long (reasoning traces among quick answers)."""
    r = random.Random(seed)
    return [_item(i, [[r.randint(*prompt), r.randint(*(long if r.random() < long_share else short))]])
            for i in range(n)]


def multi_hop(n: int, seed: int = 0, hop_alpha: float = 1.6, max_hops: int = 32, pause_s: float = 0.02) -> list[dict]:
    """IRCoT-like programs: hops Zipf-distributed (most need one or two, a few dozens),
    each hop a retrieved passage block and a thought, then an answer."""
    r = random.Random(seed)
    items = []
    for i in range(n):
        hops = min(max_hops, int(r.paretovariate(hop_alpha)))
        segs = [[r.randint(300, 700) if h == 0 else r.randint(150, 450), r.randint(16, 64)] for h in range(hops)]
        segs.append([r.randint(150, 450), r.randint(16, 48)])
        items.append(_item(i, segs, pause_s))
    return items


def item_tokens(item: dict) -> int:
    """An item's length: every segment's prompt and output tokens."""
    return sum(p + o for p, o in item["segments"])


def _by_length(items: list[dict], longest_first: bool) -> list[dict]:
    return [dict(it, id=i) for i, it in enumerate(sorted(items, key=item_tokens, reverse=longest_first))]


def sorted_by_length(items: list[dict]) -> list[dict]:
    """One large job submitted in order of length (as a file sorted by a length column
    arrives): the longest items come last."""
    return _by_length(items, longest_first=False)


def longest_first(items: list[dict]) -> list[dict]:
    """The same items, longest first: the order a scheduler that knew every length in
    advance would start them in (longest processing time first). No submission gives
    outputs' lengths ahead of time; this bounds what predicting them could buy."""
    return _by_length(items, longest_first=True)
