"""The demo corpus: real English passages that need no download, from the docstrings of
Python's standard library, and questions about them.

    shoal demo-data --out DIR [--passages N] [--questions M]

writes DIR/corpus.jsonl ({"id", "text", "source"}: a docstring cut into passages of
about `chars` characters at paragraph and sentence ends) and DIR/questions.jsonl
({"id", "question", "gold"}: a question made from a passage's first sentence, with the
id of that passage, so a run can report how often retrieval finds it). The files are
walked in sorted order: the same Python gives the same corpus.
"""

from __future__ import annotations

import ast
import random
import re
from collections.abc import Iterator
from pathlib import Path

import orjson

from shoal.stdlib_text import stdlib_modules

_SENTENCE = re.compile(r"(?<=[.!?])\s+")


def _documented() -> Iterator[tuple[str, str]]:
    """(qualified name, docstring) of modules, classes and functions, in a stable order."""
    for module, tree in stdlib_modules(frozenset({"site-packages", "test", "tests", "idlelib", "turtledemo"})):
        doc = ast.get_docstring(tree)
        if doc:
            yield module, doc
        for node in tree.body:
            targets = [node] + ([n for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
                                if isinstance(node, ast.ClassDef) else [])
            for n in targets:
                if isinstance(n, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and not n.name.startswith("_"):
                    d = ast.get_docstring(n)
                    if d:
                        owner = f"{node.name}." if n is not node else ""
                        yield f"{module}.{owner}{n.name}", d


def _chunks(doc: str, chars: int) -> Iterator[str]:
    """Paragraphs joined up to about `chars`; a longer paragraph is cut at sentence ends."""
    buf = ""
    for para in (" ".join(p.split()) for p in doc.split("\n\n")):
        if not para:
            continue
        pieces = _SENTENCE.split(para) if len(para) > chars else [para]
        for piece in pieces:
            if buf and len(buf) + len(piece) + 1 > chars:
                yield buf
                buf = ""
            buf = f"{buf} {piece}".strip()
    if buf:
        yield buf


def passages(count: int, chars: int = 400, min_chars: int = 80) -> list[dict]:
    out = []
    for name, doc in _documented():
        for i, text in enumerate(_chunks(doc, chars)):
            if len(text) >= min_chars:
                out.append({"id": f"{name}#{i}", "text": text, "source": name})
                if len(out) >= count:
                    return out
    return out


def questions(corpus: list[dict], count: int, seed: int = 0) -> list[dict]:
    """Questions about first passages of documented names: "What does NAME do, given
    that FIRST SENTENCE?" is too easy; the question keeps the name and a few words."""
    firsts = [p for p in corpus if p["id"].endswith("#0") and "." in p["source"]]
    rng = random.Random(seed)
    picked = rng.sample(firsts, min(count, len(firsts)))
    out = []
    for n, p in enumerate(picked):
        words = _SENTENCE.split(p["text"])[0].split()[:8]
        topic = " ".join(w.strip(".,:;()`'\"") for w in words).lower()
        short = p["source"].rsplit(".", 1)[-1]
        out.append({"id": f"q{n}", "question": f"What does {short} in {p['source'].split('.')[0]} do: {topic}?",
                    "gold": p["id"]})
    return out


def write_demo_data(out: str | Path, n_passages: int = 2000, n_questions: int = 64, seed: int = 0) -> tuple[Path, Path]:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    corpus = passages(n_passages)
    qs = questions(corpus, n_questions, seed)
    cpath, qpath = out / "corpus.jsonl", out / "questions.jsonl"
    cpath.write_bytes(b"".join(orjson.dumps(p) + b"\n" for p in corpus))
    qpath.write_bytes(b"".join(orjson.dumps(q) + b"\n" for q in qs))
    return cpath, qpath
