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


def bench_arguments(doc: str, sequences: int = 16, rounds: int = 2):
    """The options every W1 benchmark takes: the W1 model (made if missing), dtype,
    how many sequences, how many interleaved rounds."""
    import argparse

    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=".bench/model-small")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--sequences", type=int, default=sequences)
    ap.add_argument("--rounds", type=int, default=rounds)
    return ap


def ensure_model(path: str) -> None:
    from pathlib import Path

    if not Path(path, "config.json").exists():
        from shoal.nodes.worker.models.make_model import make_model

        make_model(path, preset="small", dtype="bfloat16")


def job_items(work: GenerationWork) -> list[dict]:
    """The work as job input: one item per prompt, with its own output length."""
    return [{"id": i, "prompt_token_ids": p, "max_tokens": n} for i, (p, n) in enumerate(zip(work.prompts, work.output_lens))]
