"""Protocol errors: each has a code that travels in an `Error` reply, and a message
that names the problem."""

from __future__ import annotations


class ProtocolError(ValueError):
    BAD_VERSION = "bad_version"
    UNKNOWN_TYPE = "unknown_type"
    MALFORMED = "malformed"
    BLOB_COUNT = "blob_count"
    TOO_LARGE = "too_large"
    INVALID_FIELD = "invalid_field"
    BAD_INPUT = "bad_input"  # a job's input (an item, a line of an upload or file) is wrong
    FORBIDDEN = "forbidden"  # not allowed to this peer (a path outside storage's data roots)

    def __init__(self, code: str, message: str):
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
