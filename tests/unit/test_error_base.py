"""One base for Shoal's errors: every exception class the package defines derives from
`ShoalError`, so a caller catches them all in one clause; refusals carry their code."""

from __future__ import annotations

import ast

import pytest

from tests.unit.import_rules import modules

BUILTIN = {"Exception", "ValueError", "RuntimeError", "ImportError", "OSError", "KeyError", "TypeError"}


def exception_classes() -> dict[str, tuple[str, list[str]]]:
    """Every class of the package whose bases name an exception: name -> (module, bases)."""
    found = {}
    for name, path in modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                bases = [b.id if isinstance(b, ast.Name) else b.attr for b in node.bases
                         if isinstance(b, (ast.Name, ast.Attribute))]
                found[node.name] = (name, bases)
    return found


def test_every_error_the_package_defines_derives_from_shoal_error():
    classes = exception_classes()

    def is_error(cls: str, seen=()) -> bool:
        return cls in BUILTIN or any(is_error(b, (*seen, cls)) for b in classes.get(cls, ("", []))[1] if b not in seen)

    def under_base(cls: str) -> bool:
        return cls == "ShoalError" or any(under_base(b) for b in classes.get(cls, ("", []))[1] if b in classes)

    errors = {c for c in classes if c != "ShoalError" and is_error(c)}
    assert len(errors) > 25  # (the walk found them)
    stray = sorted(f"{classes[c][0]}.{c}" for c in errors if not under_base(c))
    assert not stray, f"errors outside ShoalError: {stray}"


def test_one_clause_catches_them_and_refusals_carry_their_code():
    import shoal
    from shoal.protocol.errors import ProtocolError
    from shoal.request_settings import GenerationSettings, SettingsError

    with pytest.raises(shoal.ShoalError) as e:
        GenerationSettings.from_wire({"top_p": 3})
    assert isinstance(e.value, SettingsError) and isinstance(e.value, ValueError) and e.value.code is None
    err = ProtocolError(ProtocolError.INVALID_FIELD, "params.top_p: top_p must be in (0, 1]")
    assert isinstance(err, shoal.ShoalError) and err.code == "invalid_field"
