"""Every error code is declared once (protocol/errors.py) and named by its constant:
no raise and no client matches a code by a string literal."""

from __future__ import annotations

import ast
from pathlib import Path

from shoal.protocol.errors import CODES, RETRYABLE, ProtocolError

ROOT = Path(__file__).resolve().parents[2]
SOURCES = [p for d in ("shoal", "nodes", "scheduler", "protocol", "scripts") for p in (ROOT / d).rglob("*.py")]


def literal_codes(source: str) -> list[tuple[int, str]]:
    """(line, literal) for each error code written as a string: the first argument of
    ProtocolError(...)/RemoteError(...), or a string compared with something's `.code`."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", "")) in (
                "ProtocolError", "RemoteError") and node.args:
            arg = node.args[0]
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                found.append((node.lineno, arg.value))
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(isinstance(s, ast.Attribute) and s.attr == "code" for s in sides):
                for s in sides:
                    elts = s.elts if isinstance(s, (ast.Tuple, ast.List, ast.Set)) else [s]
                    found += [(node.lineno, e.value) for e in elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
    return found


def test_the_checker_catches_literal_codes():
    bad = 'raise ProtocolError("unavailable", "x")\nif e.code == "not_leader": pass\nif e.code in ("draining",): pass\n'
    assert [c for _, c in literal_codes(bad)] == ["unavailable", "not_leader", "draining"]
    assert literal_codes('raise ProtocolError(ProtocolError.UNAVAILABLE, "x")\nif e.code == ProtocolError.NOT_LEADER: pass\n') == []


def test_no_source_writes_an_error_code_as_a_string():
    offenders = [f"{p.relative_to(ROOT)}:{line}: {code!r}" for p in SOURCES for line, code in literal_codes(p.read_text())]
    assert not offenders, "name the ProtocolError constant instead:\n" + "\n".join(offenders)


def test_codes_are_declared_once_and_distinct():
    names = [k for k in vars(ProtocolError) if k.isupper()]
    assert len(CODES) == len(names)  # no two constants share a code
    assert {"unavailable", "not_leader", "stale_epoch", "unknown_job", "draining", "internal"} <= CODES
    assert RETRYABLE <= CODES
