"""What a constrained generation must produce: text that validates against a JSON schema,
matches a regular expression, or equals one of a few strings.

A sequence carries at most one constraint, as one of three sampling parameters
(`json_schema`, `regex`, `choice`; "any JSON object" is the schema `{"type": "object"}`).
It compiles to a grammar of llguidance (the Rust engine behind vLLM's `guidance`
backend: no dependencies, reads a `tokenizer.json` as it is, and computes a step's token
mask in tens of microseconds). Nothing here needs a tokenizer or torch, so the CLI and the
SDK refuse a constraint that cannot compile before a job starts, and the engine
(`nodes/worker/grammar_cache.py`) compiles the same grammar text for its tokenizer.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import orjson

from shoal.protocol.errors import ShoalError

KINDS = ("json_schema", "regex", "choice")

# JSON is written as Python's json.dumps writes it (", " and ": ", no other whitespace):
# where any whitespace is allowed, a model can fill max_tokens with blank lines (vLLM
# grew `disable_any_whitespace` for this). A schema can choose otherwise in its own
# "x-guidance" object (e.g. {"whitespace_flexible": true}), which llguidance reads.
JSON_LAYOUT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


class ConstraintError(ShoalError, ValueError):
    """A constraint that cannot compile; the message names the field and the problem."""


@dataclass(frozen=True)
class Constraint:
    kind: str  # one of KINDS
    spec: str  # the schema as compact JSON, the regex, or the choices as a JSON list

    @property
    def key(self) -> str:
        """Equal for equal constraints: what compiled grammars are cached by."""
        return f"{self.kind}:{self.spec}"

    def grammar(self) -> str:
        """The llguidance grammar text."""
        from llguidance import LLMatcher

        if self.kind == "json_schema":
            return LLMatcher.grammar_from_json_schema(self.spec, defaults=JSON_LAYOUT)
        if self.kind == "regex":
            return LLMatcher.grammar_from_regex(self.spec)
        # A choice: one Lark rule of string literals (JSON string syntax, so any text is
        # written exactly, quotes and backslashes included).
        return LLMatcher.grammar_from_lark("start: " + " | ".join(orjson.dumps(c).decode() for c in orjson.loads(self.spec)))


def constraint_of(json_schema=None, regex=None, choice=None) -> Constraint | None:
    """The one constraint among the three fields (None if none is set); raises
    ConstraintError naming the field for a malformed one or for more than one."""
    given = [k for k, v in (("json_schema", json_schema), ("regex", regex), ("choice", choice)) if v is not None]
    if not given:
        return None
    if len(given) > 1:
        raise ConstraintError(f"give one constraint, not {' and '.join(given)}")
    if json_schema is not None:
        if isinstance(json_schema, str):
            try:
                json_schema = orjson.loads(json_schema)
            except orjson.JSONDecodeError as e:
                raise ConstraintError(f"json_schema is not valid JSON: {e}") from None
        if not isinstance(json_schema, dict):
            raise ConstraintError(f"json_schema must be a JSON object (a schema), got {type(json_schema).__name__}")
        # (keys kept in their order: the output writes properties in the schema's order)
        return Constraint("json_schema", orjson.dumps(json_schema).decode())
    if regex is not None:
        if not isinstance(regex, str) or not regex:
            raise ConstraintError(f"regex must be a non-empty string, got {regex!r}")
        return Constraint("regex", regex)
    if not (isinstance(choice, (list, tuple)) and choice and all(isinstance(c, str) and c for c in choice)):
        raise ConstraintError(f"choice must be a non-empty list of non-empty strings, got {choice!r}")
    return Constraint("choice", orjson.dumps(list(choice)).decode())


@lru_cache(maxsize=1024)
def check_compiles(constraint: Constraint) -> None:
    """Raises ConstraintError if the constraint's grammar does not compile (an invalid
    schema, a regex feature the engine lacks, such as look-around). Cached: a job of a
    million items with ten schemas checks ten."""
    from llguidance import LLMatcher

    try:
        failed, messages = LLMatcher.validate_grammar_with_warnings(constraint.grammar())
    except ValueError as e:
        failed, messages = True, [str(e)]
    if failed:
        detail = messages[0].strip().splitlines()
        raise ConstraintError(f"{constraint.kind} does not compile: {' '.join(x.strip() for x in detail[:4])}")
