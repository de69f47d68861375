"""Request/reply to one node over a DEALER socket (what the SDK, ops tools and nodes build on).

A reply is matched to its request by id: a late reply to an earlier request that timed
out is discarded, never taken for the answer to the next one. `retries` re-sends a
request whose reply did not come (only for requests the receiver handles idempotently:
every work message in Shoal is, by its stable ids).
"""

from __future__ import annotations

import os
import time

import zmq

from shoal.nodes import sockets
from shoal.protocol.codec import Message, decode, encode, new_message_id

# Seconds to wait for a reply; tests with injected faults shorten it.
DEFAULT_TIMEOUT_S = float(os.environ.get("SHOAL_RPC_TIMEOUT_S", "10"))


class RemoteError(RuntimeError):
    """The node answered with an Error message."""

    def __init__(self, code: str, message: str):
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


class RpcClient:
    def __init__(self, address: str, ctx: zmq.Context | None = None, curve_keys=sockets.FROM_ENV):
        """`curve_keys`: a `CurveKeys` (or a key directory) for a cluster that uses
        CURVE; by default $SHOAL_CURVE_KEYS, if set."""
        self.address = address
        self.ctx = ctx or zmq.Context.instance()
        if isinstance(curve_keys, (str, os.PathLike)):
            from shoal.nodes.curve import CurveKeys

            curve_keys = CurveKeys.load(curve_keys)
        self.sock = sockets.dealer(self.ctx, address, keys=curve_keys)
        self.stale = 0  # late replies discarded

    def raw(self, frames: list, timeout: float = DEFAULT_TIMEOUT_S) -> Message:
        """Sends frames as they are (tests send malformed ones) and decodes the next reply."""
        self.sock.send_multipart(frames)
        if not self.sock.poll(int(timeout * 1000)):
            raise TimeoutError(f"no reply from {self.address} within {timeout}s")
        return decode(self.sock.recv_multipart())

    def _await(self, msg_id: str, deadline: float) -> Message | None:
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not self.sock.poll(int(left * 1000) + 1):
                return None
            reply = decode(self.sock.recv_multipart())
            if reply.reply_to == msg_id:
                return reply
            self.stale += 1

    def request(self, msg_type: str, fields: dict | None = None, blobs: dict | None = None,
                timeout: float = DEFAULT_TIMEOUT_S, retries: int = 0) -> Message:
        msg_id = new_message_id()
        frames = encode(msg_type, fields, blobs, msg_id=msg_id)
        for attempt in range(retries + 1):
            self.sock.send_multipart(frames)  # the same id: a reply to any copy answers it
            reply = self._await(msg_id, time.monotonic() + timeout)
            if reply is not None:
                if reply.type == "Error":
                    raise RemoteError(reply["code"], reply["message"])
                return reply
        raise TimeoutError(f"no reply from {self.address} to {msg_type} within {timeout}s"
                           + (f" ({retries + 1} tries)" if retries else ""))

    def close(self) -> None:
        self.sock.close(0)
