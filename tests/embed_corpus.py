"""Corpora for embedding tests: texts of mixed lengths in partitions of uneven sizes."""

from __future__ import annotations

import random
from pathlib import Path

import orjson

WORDS = ("the quick brown fox jumps over a lazy dog while retrieval systems embed every passage of a corpus "
         "split into partitions of uneven size so that batching them together pays off").split()


def text(r: random.Random, words: int) -> str:
    return " ".join(r.choice(WORDS) for _ in range(words))


def write_corpus(folder: Path, sizes: list[int], seed: int = 0, long_texts: int = 0) -> tuple[list[str], dict]:
    """One JSONL file per partition (p0.jsonl, ...); returns the paths and
    {partition: [(id, text), ...]} in input order. `long_texts` texts far past any
    encoder's length cap go into the first non-empty partition."""
    r = random.Random(seed)
    folder.mkdir(parents=True, exist_ok=True)
    paths, expect = [], {}
    for p, size in enumerate(sizes):
        rows = [(f"p{p}-{i}", text(r, max(1, int(r.lognormvariate(2.5, 0.8))))) for i in range(size)]
        if long_texts and size and not any(expect.values()):
            rows[:long_texts] = [(f"p{p}-long{i}", text(r, 2000)) for i in range(long_texts)]
        path = folder / f"p{p}.jsonl"
        path.write_bytes(b"".join(orjson.dumps({"id": i, "text": t}) + b"\n" for i, t in rows))
        paths.append(str(path))
        expect[f"p{p}"] = rows
    return paths, expect
