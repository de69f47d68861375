"""The data of the W3 job, all deterministic (the same Python gives the same bytes):

- passages: the words of stdlib docstrings (modules, classes, functions, methods, in the
  sorted file order of `stdlib_text.stdlib_modules`), packed in order into passages of
  40-120 words, each length drawn from random.Random(0);
- questions: 256, each a sentence of a random passage in one of 4 templates, with
  max_hops in U{1..4}, thought_tokens (one per hop) in U{16..64} and final_tokens in
  U{16..48}, all from random.Random(0);
- decoder: a random-weight Qwen3 of the `small` preset's shape (hidden 768, 12 layers, 12
  heads, 4 KV heads, intermediate 2048, tied embeddings) with MiniLM's WordPiece tokenizer
  (vocab 30522), bf16 weights.

`write_w3(folder, encoder)` writes passages.jsonl, questions.jsonl, model/, the passages'
vectors and an exact index, and returns their sizes and hashes (`w3.json`).
"""

from __future__ import annotations

import ast
import hashlib
import random
import re
from pathlib import Path

import orjson

from shoal.stdlib_text import stdlib_modules

TEMPLATES = (
    "What does the documentation mean when it says: {s}",
    "Which part of the standard library explains that {s}",
    "Find the passage that states: {s}",
    "Why is it true that {s}",
)
_SENTENCE = re.compile(r"(?<=[.!?])\s+")


def _docstring_words():
    for _, tree in stdlib_modules(frozenset({"site-packages", "test", "tests", "idlelib", "turtledemo"})):
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node)
                if doc:
                    yield from doc.split()


def passages(count: int = 3000, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    out, words, want = [], [], rng.randint(40, 120)
    for w in _docstring_words():
        words.append(w)
        if len(words) == want:
            out.append({"id": f"p{len(out)}", "text": " ".join(words)})
            if len(out) == count:
                return out
            words, want = [], rng.randint(40, 120)
    raise ValueError(f"the stdlib's docstrings hold only {len(out)} passages of 40-120 words, not {count}")


def questions(corpus: list[dict], count: int = 256, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    out = []
    for i in range(count):
        sentences = [s for s in _SENTENCE.split(corpus[rng.randrange(len(corpus))]["text"]) if s]
        sentence = " ".join(rng.choice(sentences).split()[:30]).rstrip(".")
        template = TEMPLATES[rng.randrange(len(TEMPLATES))]
        hops = rng.randint(1, 4)
        out.append({"id": f"q{i}", "question": template.format(s=sentence) + "?", "max_hops": hops,
                    "thought_tokens": [rng.randint(16, 64) for _ in range(hops)], "final_tokens": rng.randint(16, 48)})
    return out


def workload(items: list[dict]) -> dict:
    """What the job must do, known before it runs: every request generates exactly its
    max_tokens (EOS ignored, the stop string never decodes)."""
    hops = sum(it["max_hops"] for it in items)
    return {"questions": len(items), "generates": hops + len(items), "retrievals": hops,
            "generated_tokens": sum(sum(it["thought_tokens"][:it["max_hops"]]) + it["final_tokens"] for it in items)}


def _digest(rows: list[dict]) -> str:
    return hashlib.sha256(b"".join(orjson.dumps(r) + b"\n" for r in rows)).hexdigest()[:16]


def make_decoder(folder: str | Path, encoder: str | Path, dtype: str = "bfloat16", preset: str = "small") -> Path:
    from shoal.nodes.worker.models.make_model import make_model

    if not Path(folder, "config.json").exists():  # written last: a run cut off mid-write makes it again
        make_model(folder, preset=preset, dtype=dtype, tokenizer=encoder)
    return Path(folder)


def write_w3(folder: str | Path, encoder: str | Path, n_passages: int = 3000, n_questions: int = 256,
             preset: str = "small") -> dict:
    """Writes (or reuses, when its hashes match) the W3 data under `folder`; the decoder
    is of `preset`'s shape (the GPU check takes `qwen3-1.7b`'s)."""
    import numpy as np

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    corpus = passages(n_passages)
    items = questions(corpus, n_questions)
    meta = {"passages": len(corpus), "passages_sha": _digest(corpus), "questions_sha": _digest(items), **workload(items)}
    done = folder / "w3.json"
    if done.exists() and orjson.loads(done.read_bytes()).get("passages_sha") == meta["passages_sha"] and \
            (folder / "index" / "index.json").exists():
        (folder / "questions.jsonl").write_bytes(b"".join(orjson.dumps(q) + b"\n" for q in items))
        return {**orjson.loads(done.read_bytes()), **meta}
    (folder / "passages.jsonl").write_bytes(b"".join(orjson.dumps(p) + b"\n" for p in corpus))
    (folder / "questions.jsonl").write_bytes(b"".join(orjson.dumps(q) + b"\n" for q in items))
    make_decoder(folder / "model", encoder, preset=preset)
    from shoal.nodes.worker.models.encoder import Encoder
    from shoal.vector_index import write_index

    enc = Encoder(str(encoder))
    vectors = enc.encode([p["text"] for p in corpus]).float().numpy()
    np.save(folder / "vectors.npy", vectors)
    write_index(folder / "index", [p["id"] for p in corpus], [p["text"] for p in corpus], vectors, enc.fingerprint)
    done.write_bytes(orjson.dumps(meta, option=orjson.OPT_INDENT_2))
    return meta
