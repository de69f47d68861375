"""The workloads of ../shared/BENCHMARKS.md, generated from fixed seeds."""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True)
class GenerationWork:
    prompts: list[list[int]]
    output_lens: list[int]

    @property
    def prompt_tokens(self) -> int:
        return sum(map(len, self.prompts))

    @property
    def output_tokens(self) -> int:
        return sum(self.output_lens)


def w1(vocab_size: int = 32000, sequences: int = 128, seed: int = 0) -> GenerationWork:
    """W1: prompts of U[128, 256] random token ids, outputs of U[128, 256] tokens."""
    r = random.Random(seed)
    prompts = [[r.randrange(vocab_size - 1) for _ in range(r.randint(128, 256))] for _ in range(sequences)]
    outs = [r.randint(128, 256) for _ in range(sequences)]
    return GenerationWork(prompts, outs)
