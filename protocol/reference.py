"""The wire protocol's reference, rendered from the declarations themselves
(`messages.py`, `errors.py`, `version.py`): docs/protocol.md is this text, and a test
keeps it current.

    python -m shoal.protocol.reference > docs/protocol.md
"""

from __future__ import annotations

from shoal.protocol.errors import CODES, RETRYABLE
from shoal.protocol.messages import MESSAGES
from shoal.protocol.version import PROTOCOL_MAJOR, PROTOCOL_MINOR

INTRO = f"""# The wire protocol (version {PROTOCOL_MAJOR}.{PROTOCOL_MINOR})

Written from `protocol/` by `python -m shoal.protocol.reference`; do not edit by hand.

Every node serves one ZeroMQ ROUTER socket; a client connects a DEALER to it. A
message is a multipart ZeroMQ message `[header, blob0, blob1, ...]`:

- `header`: one JSON object (UTF-8), `{{"v": [major, minor], "type": NAME, "id": ID,
  "re": ID-or-null, "blobs": [blob names, in frame order], "f": {{fields}}}}`. `id` is
  unique per request (any string); a reply carries the request's id in `re`, which is
  how a client matches replies to requests (a late reply to an abandoned request is
  dropped by its `re`). At most 1 MiB.
- blobs: raw bytes, named in `header.blobs`: tensors as safetensors, tables as Arrow IPC
  streams, file chunks as they are. A whole message is at most 64 MiB by default; larger
  payloads travel in chunks.

Field kinds: `str`, `int`, `float`, `bool`, `id` (a string or an integer), `list[id]`,
`list[int]`, `list[str]`, `list[dict]`, `list[pair]` (two-element lists), `dict`,
`dict[list]` (every value a list), `list`, `any` (JSON of any shape). A field declared
with keys requires them in the dict, or in every dict of the list. A field of the wrong
kind or shape is refused (`invalid_field`) before any handler sees the message.

A request is answered by exactly one reply: the one its description names, or `Error`
with a code from the table below and a message that names the problem. A node never
closes the connection over a bad message.

**Versions.** Within a major version, fields and blobs are only ever added, optional
and with defaults; never reordered, renamed, retyped or removed. A receiver ignores
fields it does not know (a newer minor version) and answers another major version with
`Error` `bad_version`. Send the fields you know; a field left out takes its default.

**Delivery.** ZeroMQ drops nothing silently here (ROUTER_MANDATORY, bounded queues), but
a peer that dies loses what it held. Every work message is idempotent by the ids it
carries (a sequence id, an upload id, a transfer id): on a timeout, send it again.
"""


def _field(f) -> str:
    default = "required" if f.required else f"default `{f.default!r}`" if not callable(f.default) \
        else f"default `{f.default.__name__}()`"
    keys = f"; each with {', '.join(f'`{k}`' for k in f.keys)}" if f.keys else ""
    return f"`{f.name}` ({f.kind}{', or null' if f.nullable else ''}{keys}; {default})"


def render() -> str:
    out = [INTRO, "## Error codes\n", "| code | retry the same request? |", "|---|---|"]
    out += [f"| `{code}` | {'yes, later or elsewhere' if code in RETRYABLE else 'no'} |" for code in sorted(CODES)]
    out += ["", "## Messages\n"]
    for m in MESSAGES.values():
        out.append(f"### {m.name}\n\n{m.doc}\n")
        out += [f"- {_field(f)}" for f in m.fields] or ["- no fields"]
        if m.blobs:
            out.append("- blobs: " + ", ".join(f"`{b}`" + (" (required)" if b in m.required_blobs else "")
                                               for b in m.blobs))
        out.append("")
    return "\n".join(out)


if __name__ == "__main__":
    print(render(), end="")
