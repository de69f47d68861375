"""Declaring a message type once: its fields, their types and defaults, its blobs.

The same declaration encodes (fills defaults, checks what is sent) and validates what
is received, so a sender and a receiver can never disagree about a message's shape.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from shoal.protocol.errors import ProtocolError

REQUIRED = object()

# Field kinds: checked on both sides. "any" is JSON of any shape (program arguments).
_CHECKS = {
    "str": lambda v: isinstance(v, str),
    "int": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "float": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "bool": lambda v: isinstance(v, bool),
    "id": lambda v: (isinstance(v, (str, int)) and not isinstance(v, bool)),
    "list[int]": lambda v: isinstance(v, list) and all(isinstance(x, int) and not isinstance(x, bool) for x in v),
    "list[str]": lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v),
    "list": lambda v: isinstance(v, list),
    "list[id]": lambda v: isinstance(v, list) and all(isinstance(x, (str, int)) and not isinstance(x, bool) for x in v),
    "list[dict]": lambda v: isinstance(v, list) and all(isinstance(x, dict) for x in v),
    "list[pair]": lambda v: isinstance(v, list) and all(isinstance(x, list) and len(x) == 2 for x in v),
    "dict": lambda v: isinstance(v, dict),
    "dict[list]": lambda v: isinstance(v, dict) and all(isinstance(x, list) for x in v.values()),
    "any": lambda v: True,
}


@dataclass(frozen=True)
class Field:
    name: str
    kind: str
    default: Any = REQUIRED
    nullable: bool = False
    # For a dict, or a list of dicts: keys each must have (a sequence's seq_id, a
    # record's id), so that a handler never meets an entry it cannot even name.
    keys: tuple[str, ...] = ()

    def __post_init__(self):
        if self.kind not in _CHECKS:
            raise ValueError(f"unknown field kind {self.kind!r}")

    @property
    def required(self) -> bool:
        return self.default is REQUIRED

    def check(self, msg_type: str, value: Any) -> None:
        if value is None and self.nullable:
            return
        if not _CHECKS[self.kind](value):
            raise ProtocolError(ProtocolError.INVALID_FIELD,
                                f"{msg_type}.{self.name} must be {self.kind}, got {type(value).__name__} {str(value)[:60]!r}")
        if self.keys:
            entries = [("", value)] if isinstance(value, dict) else [(f"[{i}]", v) for i, v in enumerate(value)]
            for where, entry in entries:
                missing = [k for k in self.keys if k not in entry]
                if missing:
                    raise ProtocolError(ProtocolError.INVALID_FIELD, f"{msg_type}.{self.name}{where} lacks "
                                        f"{missing[0]!r}: {str(entry)[:60]!r}")


@dataclass(frozen=True)
class MessageType:
    name: str
    doc: str
    fields: tuple[Field, ...] = ()
    blobs: tuple[str, ...] = ()  # names of the binary frames it may carry, in order
    required_blobs: tuple[str, ...] = ()
    _by_name: dict = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self):
        self._by_name.update({f.name: f for f in self.fields})

    def fill(self, values: dict) -> dict:
        """Values for every declared field, defaults filled; raises on a missing required
        field, a wrong type, or an undeclared field (a sender's bug)."""
        extra = set(values) - set(self._by_name)
        if extra:
            raise ProtocolError(ProtocolError.INVALID_FIELD, f"{self.name} has no field {sorted(extra)[0]!r}")
        return self.validate(values, ignore_unknown=False)

    def validate(self, values: dict, ignore_unknown: bool) -> dict:
        out = {}
        for f in self.fields:
            if f.name in values:
                f.check(self.name, values[f.name])
                out[f.name] = values[f.name]
            elif f.required:
                raise ProtocolError(ProtocolError.INVALID_FIELD, f"{self.name} lacks required field {f.name!r}")
            else:
                out[f.name] = f.default() if callable(f.default) else f.default
        if not ignore_unknown:
            extra = set(values) - set(self._by_name)
            if extra:
                raise ProtocolError(ProtocolError.INVALID_FIELD, f"{self.name} has unknown field {sorted(extra)[0]!r}")
        return out
