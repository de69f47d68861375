"""Real English text that needs no download: the docstrings of Python's standard library.

Used to train the tokenizer of random-weight test models and (later) as the demo corpus.
The files are walked in sorted order so the same Python gives the same text.
"""

from __future__ import annotations

import ast
import sysconfig
from collections.abc import Iterator
from pathlib import Path


def stdlib_docstrings(max_chars: int | None = None) -> Iterator[str]:
    root = Path(sysconfig.get_paths()["stdlib"])
    total = 0
    for path in sorted(root.rglob("*.py")):
        if "site-packages" in path.parts or "test" in path.parts or "tests" in path.parts:
            continue
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, OSError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node)
                if doc and len(doc) > 40:
                    yield doc
                    total += len(doc)
                    if max_chars is not None and total >= max_chars:
                        return
