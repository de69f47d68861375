"""Protocol errors: each has a code that travels in an `Error` reply, and a message
that names the problem.

Every code is declared here, once; raisers and clients name the constant, never the
string (a unit test walks the source for literals). A code says what the sender of the
request should do: fix the request (malformed ... forbidden), ask again later
(unavailable, not_leader, draining, disk_full), or stop speaking for a deposed leader (stale_epoch).
"""

from __future__ import annotations


class ShoalError(Exception):
    """The base of every error Shoal raises on purpose, so a caller can catch them all in
    one clause (`except shoal.ShoalError`). `code` is the protocol's error code where one
    applies (a refusal that crossed the wire, below), else None; the message names the
    problem. Each subclass keeps the built-in base it always had (ValueError for bad
    input, RuntimeError for a failed run) so existing `except` clauses still hold."""

    code: str | None = None


class ProtocolError(ShoalError, ValueError):
    # The message itself is wrong.
    BAD_VERSION = "bad_version"
    UNKNOWN_TYPE = "unknown_type"
    MALFORMED = "malformed"
    BLOB_COUNT = "blob_count"
    TOO_LARGE = "too_large"
    INVALID_FIELD = "invalid_field"
    BAD_INPUT = "bad_input"  # a job's input (an item, a line of an upload or file) is wrong
    FORBIDDEN = "forbidden"  # not allowed to this peer (a path outside storage's data roots)
    # What it names does not exist here.
    UNKNOWN_JOB = "unknown_job"
    UNKNOWN_INDEX = "unknown_index"  # no shard of that index is loaded on this node
    # Not now, or not here: retry (elsewhere, or later).
    UNAVAILABLE = "unavailable"  # a peer it needs is missing or did not answer; a leader still taking over
    DISK_FULL = "disk_full"  # the node's disk has no room for the write (1.10): retry once space is freed
    NOT_LEADER = "not_leader"  # a standby scheduler was asked what only the leader answers
    DRAINING = "draining"  # a draining worker takes no new work
    STALE_EPOCH = "stale_epoch"  # the sender speaks for a leader that has been replaced
    INTERNAL = "internal"  # a bug in the handler: the request failed, the node lives on

    def __init__(self, code: str, message: str):
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


CODES = frozenset(v for k, v in vars(ProtocolError).items() if k.isupper() and isinstance(v, str))
# Codes after which the same request may succeed if sent again (later, or to another node).
RETRYABLE = frozenset({ProtocolError.UNAVAILABLE, ProtocolError.NOT_LEADER, ProtocolError.DISK_FULL})
