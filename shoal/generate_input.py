"""Reading `shoal generate` input: JSONL lines `{"id", "prompt" | "prompt_token_ids", ["max_tokens"]}`.

Every problem is reported with its line number before any work starts.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import orjson


class InputError(ValueError):
    """Bad job input; the message names the file and line."""


@dataclass(frozen=True)
class GenerateItem:
    id: object
    prompt: str | None
    prompt_token_ids: list[int] | None
    max_tokens: int | None


def read_generate_items(path: str | Path) -> list[GenerateItem]:
    path = Path(path)
    if not path.is_file():
        raise InputError(f"input file {path} does not exist")
    items, seen = [], {}
    with path.open("rb") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                rec = orjson.loads(line)
            except orjson.JSONDecodeError as e:
                raise InputError(f"{where}: not valid JSON ({e})") from None
            if not isinstance(rec, dict) or "id" not in rec:
                raise InputError(f"{where}: each line must be an object with an \"id\"")
            rid = rec["id"]
            if not isinstance(rid, (str, int)) or isinstance(rid, bool):
                raise InputError(f"{where}: id must be a string or an integer, got {rid!r}")
            if rid in seen:
                raise InputError(f"{where}: duplicate id {rid!r} (first on line {seen[rid]})")
            seen[rid] = lineno
            prompt, ids = rec.get("prompt"), rec.get("prompt_token_ids")
            if (prompt is None) == (ids is None):
                raise InputError(f"{where}: give exactly one of \"prompt\" and \"prompt_token_ids\"")
            if prompt is not None and not isinstance(prompt, str):
                raise InputError(f"{where}: prompt must be a string")
            if ids is not None and not (isinstance(ids, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in ids)):
                raise InputError(f"{where}: prompt_token_ids must be a list of integers")
            mt = rec.get("max_tokens")
            if mt is not None and (not isinstance(mt, int) or isinstance(mt, bool) or mt <= 0):
                raise InputError(f"{where}: max_tokens must be a positive integer, got {mt!r}")
            items.append(GenerateItem(rid, prompt, ids, mt))
    return items
