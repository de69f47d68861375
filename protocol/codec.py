"""Encoding and decoding messages: `[header, blob0, blob1, ...]` frames.

The header is orjson: {"v": [major, minor], "type", "id", "re", "blobs": [names], "f":
{fields}}. Decoding checks everything before a handler sees the message and raises
`ProtocolError` with a code for the `Error` reply; it never trusts a size or count it
has not checked against the frames it holds.
"""

from __future__ import annotations

import itertools
import os
from dataclasses import dataclass, field

import orjson

from shoal.protocol.errors import ProtocolError
from shoal.protocol.messages import MESSAGES
from shoal.protocol.version import PROTOCOL_MAJOR, PROTOCOL_MINOR

DEFAULT_MAX_MESSAGE_BYTES = 64 << 20  # a whole message; large payloads travel in chunks
MAX_HEADER_BYTES = 1 << 20

_ids = itertools.count()
_prefix = os.urandom(4).hex()


def new_message_id() -> str:
    return f"{_prefix}-{next(_ids)}"


@dataclass
class Message:
    type: str
    fields: dict
    blobs: dict[str, bytes] = field(default_factory=dict)
    id: str = ""
    reply_to: str | None = None
    version: tuple[int, int] = (PROTOCOL_MAJOR, PROTOCOL_MINOR)

    def __getitem__(self, name: str):
        return self.fields[name]

    def get(self, name: str, default=None):
        return self.fields.get(name, default)


def encode(msg_type: str, fields: dict | None = None, blobs: dict[str, bytes] | None = None,
           msg_id: str | None = None, reply_to: str | None = None) -> list[bytes]:
    spec = MESSAGES.get(msg_type)
    if spec is None:
        raise ProtocolError(ProtocolError.UNKNOWN_TYPE, f"no message type {msg_type!r}")
    values = spec.fill(fields or {})
    blobs = blobs or {}
    unknown = [b for b in blobs if b not in spec.blobs]
    if unknown:
        raise ProtocolError(ProtocolError.BLOB_COUNT, f"{msg_type} carries no blob {unknown[0]!r}")
    names = [b for b in spec.blobs if b in blobs]
    header = {"v": [PROTOCOL_MAJOR, PROTOCOL_MINOR], "type": msg_type, "id": msg_id or new_message_id(),
              "re": reply_to, "blobs": names, "f": values}
    # Blobs go out as given (bytes or buffers): ZeroMQ sends them without a copy.
    return [orjson.dumps(header, option=orjson.OPT_SORT_KEYS)] + [blobs[n] for n in names]


def decode(frames: list, max_bytes: int = DEFAULT_MAX_MESSAGE_BYTES) -> Message:
    if not frames:
        raise ProtocolError(ProtocolError.MALFORMED, "empty message (no frames)")
    total = sum(len(f) for f in frames)
    if total > max_bytes:
        raise ProtocolError(ProtocolError.TOO_LARGE, f"message of {total} bytes exceeds the cap of {max_bytes}")
    raw = bytes(frames[0])
    if len(raw) > MAX_HEADER_BYTES:
        raise ProtocolError(ProtocolError.TOO_LARGE, f"header of {len(raw)} bytes exceeds {MAX_HEADER_BYTES}")
    if not raw:
        raise ProtocolError(ProtocolError.MALFORMED, "empty header frame")
    try:
        header = orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        raise ProtocolError(ProtocolError.MALFORMED, f"header is not JSON ({e})") from None
    if not isinstance(header, dict):
        raise ProtocolError(ProtocolError.MALFORMED, "header is not an object")
    version = header.get("v")
    if not (isinstance(version, list) and len(version) == 2 and all(isinstance(x, int) for x in version)):
        raise ProtocolError(ProtocolError.MALFORMED, "header lacks a [major, minor] version")
    if version[0] != PROTOCOL_MAJOR:
        raise ProtocolError(ProtocolError.BAD_VERSION,
                            f"protocol {version[0]}.{version[1]} is not compatible with {PROTOCOL_MAJOR}.{PROTOCOL_MINOR}")
    msg_type = header.get("type")
    spec = MESSAGES.get(msg_type) if isinstance(msg_type, str) else None
    if spec is None:
        raise ProtocolError(ProtocolError.UNKNOWN_TYPE, f"unknown message type {msg_type!r}")
    msg_id, reply_to = header.get("id"), header.get("re")
    if not isinstance(msg_id, str) or not (reply_to is None or isinstance(reply_to, str)):
        raise ProtocolError(ProtocolError.MALFORMED, f"{msg_type}: id and re must be strings")
    names = header.get("blobs", [])
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise ProtocolError(ProtocolError.MALFORMED, f"{msg_type}: blobs must be a list of names")
    if len(names) != len(frames) - 1:
        raise ProtocolError(ProtocolError.BLOB_COUNT,
                            f"{msg_type}: header names {len(names)} blobs, message has {len(frames) - 1}")
    newer = version[1] > PROTOCOL_MINOR
    known = [n for n in names if n in spec.blobs]
    if len(known) != len(names) and not newer:
        raise ProtocolError(ProtocolError.BLOB_COUNT, f"{msg_type} carries no blob {next(n for n in names if n not in spec.blobs)!r}")
    missing = [b for b in spec.required_blobs if b not in names]
    if missing:
        raise ProtocolError(ProtocolError.BLOB_COUNT, f"{msg_type} lacks blob {missing[0]!r}")
    values = header.get("f", {})
    if not isinstance(values, dict):
        raise ProtocolError(ProtocolError.MALFORMED, f"{msg_type}: fields must be an object")
    fields = spec.validate(values, ignore_unknown=newer)
    blobs = {n: frames[i + 1] for i, n in enumerate(names) if n in spec.blobs}
    return Message(msg_type, fields, blobs, msg_id, reply_to, (version[0], version[1]))


def error_reply(err: ProtocolError, about: str = "", reply_to: str | None = None) -> list[bytes]:
    return encode("Error", {"code": err.code, "message": err.message, "about": about}, reply_to=reply_to)
