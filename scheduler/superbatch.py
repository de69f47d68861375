"""SuperBatch packing for bulk embedding (SURGE).

A job's corpus is a list of logical partitions with their sizes. Whole partitions are
packed into a SuperBatch until it holds at least `b_min` texts; a partition larger than
`n_max` is cut into pieces of at most `n_max` rows. Before a piece is added the
SuperBatch holds fewer than `b_min` texts, so none ever exceeds `b_min + n_max - 1`.

Boundaries depend only on the job's partition list (in its stored order) and sizes,
never on arrival or timing, and a SuperBatch's id is a hash of its content (partition
and row range of each slice): a restarted job packs exactly the same SuperBatches, and
a manifest of finished ids tells what to skip.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass


@dataclass(frozen=True)
class Slice:
    partition: str
    start: int  # first row
    end: int  # one past the last row

    @property
    def size(self) -> int:
        return self.end - self.start


@dataclass(frozen=True)
class SuperBatch:
    id: str
    slices: tuple[Slice, ...]

    @property
    def size(self) -> int:
        return sum(s.size for s in self.slices)


def superbatch_id(slices) -> str:
    key = "|".join(f"{s.partition}:{s.start}-{s.end}" for s in slices)
    return "sb-" + hashlib.blake2b(key.encode(), digest_size=8).hexdigest()


def pack(partitions: list[tuple[str, int]], b_min: int, n_max: int) -> list[SuperBatch]:
    """SuperBatches covering every row of every partition exactly once, in order."""
    if b_min < 1 or n_max < 1:
        raise ValueError(f"b_min and n_max must be at least 1, got b_min={b_min}, n_max={n_max}")
    seen = set()
    out: list[SuperBatch] = []
    current: list[Slice] = []
    held = 0
    for name, size in partitions:
        if name in seen:
            raise ValueError(f"partition {name!r} is listed twice")
        if size < 0:
            raise ValueError(f"partition {name!r} has a negative size {size}")
        seen.add(name)
        for start in range(0, size, n_max):
            piece = Slice(str(name), start, min(start + n_max, size))
            current.append(piece)
            held += piece.size
            if held >= b_min:
                out.append(SuperBatch(superbatch_id(current), tuple(current)))
                current, held = [], 0
    if current:
        out.append(SuperBatch(superbatch_id(current), tuple(current)))
    return out


# Padded tokens per encoder micro-batch. On this project's 2-core CPU a MiniLM batch of
# 2048 tokens ran 25% faster than 8192 (activations that fit in cache).
DEFAULT_TOKEN_BUDGET = 2048
# On a GPU a micro-batch of 2048 tokens is launch-bound: MiniLM's ~90 kernels take about
# 0.5 ms to launch from Python, while an H100 computes its 90 GFLOP in about 0.2 ms; at
# 16,384 tokens the compute (~1.5 ms) hides the launches and a SuperBatch reads its
# vectors back a few times, not a hundred. Not yet measured on a GPU: the device check
# (scripts/gpu_check.py, w2) times both budgets.
GPU_TOKEN_BUDGET = 16384
# The least budget an encoder takes: its calibration fits a line through micro-batches
# of 16 to 128 tokens (`encoder_calibration.grid`).
MIN_TOKEN_BUDGET = 128


def default_token_budget(on_gpu: bool) -> int:
    return GPU_TOKEN_BUDGET if on_gpu else DEFAULT_TOKEN_BUDGET


def check_token_budget(budget) -> int:
    if not isinstance(budget, int) or isinstance(budget, bool) or budget < MIN_TOKEN_BUDGET:
        raise ValueError(f"the encoder's token budget must be at least {MIN_TOKEN_BUDGET} padded tokens "
                         f"(its calibration times micro-batches of 16 to 128), not {budget!r}")
    return budget


def token_budget_arg(text: str) -> int:
    """--encoder-token-budget: refused when the command starts, not once a worker has loaded."""
    import argparse

    try:
        return check_token_budget(int(text))
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def micro_batches(sorted_lengths: list[int], token_budget: int) -> list[range]:
    """Cuts texts sorted by length into consecutive micro-batches whose padded size
    (count × longest) stays within `token_budget` (a text longer than it goes alone)."""
    out, start, n = [], 0, len(sorted_lengths)
    while start < n:
        end = start + 1
        while end < n and (end + 1 - start) * sorted_lengths[end] <= token_budget:
            end += 1
        out.append(range(start, end))
        start = end
    return out
