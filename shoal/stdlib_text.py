"""Real English text that needs no download: the docstrings of Python's standard library.

Used to train the tokenizer of random-weight test models and, cut into passages, as the
demo corpus (`demo_corpus.py`).
The files are walked in sorted order so the same Python gives the same text.
"""

from __future__ import annotations

import ast
import sysconfig
from collections.abc import Iterator
from pathlib import Path


def stdlib_modules(skip: frozenset[str] = frozenset({"site-packages", "test", "tests"})) -> Iterator[tuple[str, ast.Module]]:
    """(dotted module name, parsed tree) of every stdlib source file, in sorted order,
    leaving out those under a folder named in `skip` and those that do not parse."""
    root = Path(sysconfig.get_paths()["stdlib"])
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if skip & set(rel.parts):
            continue
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, OSError, ValueError):
            continue
        yield ".".join(rel.with_suffix("").parts).removesuffix(".__init__"), tree


def stdlib_docstrings(max_chars: int | None = None) -> Iterator[str]:
    total = 0
    for _, tree in stdlib_modules():
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node)
                if doc and len(doc) > 40:
                    yield doc
                    total += len(doc)
                    if max_chars is not None and total >= max_chars:
                        return
