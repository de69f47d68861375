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

from shoal.transport import sockets
from shoal.protocol.codec import Message, decode, encode, new_message_id
from shoal.protocol.errors import ShoalError

# Seconds to wait for a reply; tests with injected faults shorten it.
DEFAULT_TIMEOUT_S = float(os.environ.get("SHOAL_RPC_TIMEOUT_S", "10"))


class RemoteError(ShoalError, RuntimeError):
    """The node answered with an Error message."""

    def __init__(self, code: str, message: str):
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


class HandshakeFailed(ShoalError, RuntimeError):
    """The connection's security handshake failed: a request can never be answered."""


HANDSHAKE_EVENTS = (zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
                    | zmq.EVENT_HANDSHAKE_FAILED_AUTH | zmq.EVENT_HANDSHAKE_SUCCEEDED)


class RpcClient:
    def __init__(self, address: str, ctx: zmq.Context | None = None, curve_keys=sockets.FROM_ENV,
                 watch_handshake: bool = False):
        """`curve_keys`: a `CurveKeys` (or a key directory) for a cluster that uses
        CURVE; by default $SHOAL_CURVE_KEYS, if set. With `watch_handshake` (clients
        people run), a request that times out after a failed handshake says why
        (no keys, wrong keys) instead of only that no reply came."""
        self.address = address
        self.ctx = ctx or zmq.Context.instance()
        if isinstance(curve_keys, (str, os.PathLike)):
            from shoal.transport.curve import CurveKeys

            curve_keys = CurveKeys.load(curve_keys)
        self.keys = curve_keys = sockets.resolve_keys(curve_keys)
        self.sock = sockets.dealer(self.ctx, address, keys=curve_keys)
        self.stale = 0  # late replies discarded
        self._monitor = None
        self._last_handshake, self._failures = None, 0
        if watch_handshake:
            import uuid

            self._monitor = self.sock.get_monitor_socket(HANDSHAKE_EVENTS, addr=f"inproc://handshake-{uuid.uuid4().hex}")

    def handshake_failure(self) -> str | None:
        """Why handshakes with the node fail, if they do (None: the last one succeeded,
        none happened yet, or this client does not watch). A mechanism mismatch or an
        authentication refusal is certain at once; a handshake cut short without detail
        (what a wrong key looks like from the client) counts only when it repeats, since
        a node restarting mid-handshake looks the same once."""
        if self._monitor is None:
            return None
        from zmq.utils.monitor import recv_monitor_message

        while self._monitor.poll(0):
            event = recv_monitor_message(self._monitor)["event"]
            self._failures = 0 if event == zmq.EVENT_HANDSHAKE_SUCCEEDED else self._failures + 1
            self._last_handshake = event
        last = self._last_handshake
        if last is None or last == zmq.EVENT_HANDSHAKE_SUCCEEDED:
            return None
        if last == zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL and self._failures < 3:
            return None
        if self.keys is None:
            return (f"the security handshake with {self.address} failed: the cluster uses CURVE and this client "
                    "has no CURVE keys (set SHOAL_CURVE_KEYS to the cluster's key directory)")
        if last == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL:
            return (f"the security handshake with {self.address} failed: this client uses CURVE keys "
                    f"({self.keys.directory}) and the node does not")
        return (f"the security handshake with {self.address} keeps failing: the node refused this client's CURVE "
                f"keys ({self.keys.directory}; are they the cluster's?), or it is not a Shoal node")

    def raw(self, frames: list, timeout: float = DEFAULT_TIMEOUT_S) -> Message:
        """Sends frames as they are (tests send malformed ones) and decodes the next reply."""
        self.sock.send_multipart(frames)
        if not self.sock.poll(int(timeout * 1000)):
            raise TimeoutError(f"no reply from {self.address} within {timeout}s")
        return decode(self.sock.recv_multipart())

    def _await(self, msg_id: str, deadline: float, abandon=None) -> Message | None:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            # In slices, so that a failed handshake is reported at once, not at the deadline.
            slice_s = min(left, 0.5 if self._monitor else left, 0.25 if abandon else left)
            if not self.sock.poll(int(slice_s * 1000) + 1):
                if (why := self.handshake_failure()) is not None:
                    raise HandshakeFailed(why)
                if abandon is not None and abandon():
                    return None
                continue
            reply = decode(self.sock.recv_multipart())
            if reply.reply_to == msg_id:
                return reply
            self.stale += 1

    def request(self, msg_type: str, fields: dict | None = None, blobs: dict | None = None,
                timeout: float = DEFAULT_TIMEOUT_S, retries: int = 0, deadline: float | None = None,
                abandon=None) -> Message:
        """Sends a request and waits `timeout` for its reply, re-sending it up to
        `retries` times (never past `deadline`, a time.monotonic() value, if given).
        `abandon()`, asked while no reply has come, ends the wait early when it turns
        true (TimeoutError): e.g. the request should now go elsewhere."""
        msg_id = new_message_id()
        frames = encode(msg_type, fields, blobs, msg_id=msg_id)
        waited, sent = 0.0, 0
        for _ in range(retries + 1):
            if deadline is not None and time.monotonic() >= deadline:
                break
            self.sock.send_multipart(frames)
            sent += 1  # the same id: a reply to any copy answers it
            t = time.monotonic()
            end = t + timeout if deadline is None else min(t + timeout, deadline)
            reply = self._await(msg_id, end, abandon)
            waited += time.monotonic() - t
            if reply is not None:
                if reply.type == "Error":
                    raise RemoteError(reply["code"], reply["message"])
                return reply
        if (why := self.handshake_failure()) is not None:
            raise HandshakeFailed(why)
        raise TimeoutError(f"no reply from {self.address} to {msg_type} within {waited:.0f}s"
                           + (f" ({sent} tries)" if sent > 1 else ""))

    def close(self) -> None:
        if self._monitor is not None:
            self.sock.disable_monitor()
            self._monitor.close(0)
        self.sock.close(0)
