"""The workloads of the benchmark definitions, generated from fixed seeds."""

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

    def with_fresh_tokens(self, seed: int, vocab_size: int = 32000) -> "GenerationWork":
        """The same shape (prompt and output lengths) with new random token ids: a warm
        engine computes it in full instead of serving it from its prefix cache."""
        r = random.Random(seed)
        return GenerationWork([[r.randrange(vocab_size - 1) for _ in p] for p in self.prompts], self.output_lens)


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
    ap.add_argument("--dtype", default="auto", help="auto: what the worker picks on this CPU")
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


def vocabulary_words(encoder_folder: str) -> list[str]:
    """Whole words of an encoder's WordPiece vocabulary (W2 draws texts from them)."""
    import json
    from pathlib import Path

    vocab = json.loads((Path(encoder_folder) / "tokenizer.json").read_text())["model"]["vocab"]
    return sorted(w for w in vocab if w.isalpha() and w.isascii() and len(w) > 1)


def w2_partition_sizes(texts: int, partitions: int, sigma: float, seed: int = 0) -> list[int]:
    """Log-normal partition sizes with shape σ, scaled to `texts` in all (each >= 1)."""
    r = random.Random(seed)
    raw = [r.lognormvariate(0.0, sigma) for _ in range(partitions)]
    scale = (texts - partitions) / sum(raw)
    exact = [x * scale for x in raw]
    sizes = [1 + int(x) for x in exact]
    by_fraction = sorted(range(partitions), key=lambda i: int(exact[i]) - exact[i])  # largest remainders first
    for i in by_fraction[:texts - sum(sizes)]:
        sizes[i] += 1
    return sizes


def w2_texts(words: list[str], n: int, seed: int = 0) -> list[str]:
    """W2 texts: vocabulary words, lengths log-normal with median ~20 words, in [3, 250]."""
    r = random.Random(seed)
    return [" ".join(r.choice(words) for _ in range(min(250, max(3, int(r.lognormvariate(3.0, 0.6))))))
            for _ in range(n)]


def write_w2_corpus(folder, texts: list[str], sizes: list[int]) -> list[str]:
    """One JSONL file per partition (the input of `shoal embed`); returns the paths."""
    from pathlib import Path

    import orjson

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    paths, i = [], 0
    for p, size in enumerate(sizes):
        path = folder / f"part-{p:05d}.jsonl"
        path.write_bytes(b"".join(orjson.dumps({"id": f"{p}-{k}", "text": t}) + b"\n"
                                  for k, t in enumerate(texts[i:i + size])))
        i += size
        paths.append(str(path))
    return paths
