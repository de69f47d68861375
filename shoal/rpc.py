"""Request/reply to one node over a DEALER socket (what the SDK and ops tools build on)."""

from __future__ import annotations

import zmq

from shoal.nodes import sockets
from shoal.protocol.codec import Message, decode, encode


class RemoteError(RuntimeError):
    """The node answered with an Error message."""

    def __init__(self, code: str, message: str):
        super().__init__(f"{code}: {message}")
        self.code = code


class RpcClient:
    def __init__(self, address: str, ctx: zmq.Context | None = None):
        self.ctx = ctx or zmq.Context.instance()
        self.sock = sockets.dealer(self.ctx, address)

    def raw(self, frames: list, timeout: float = 10.0) -> Message:
        """Sends frames as they are (tests send malformed ones) and decodes the reply."""
        self.sock.send_multipart(frames)
        if not self.sock.poll(int(timeout * 1000)):
            raise TimeoutError(f"no reply within {timeout}s")
        return decode(self.sock.recv_multipart())

    def request(self, msg_type: str, fields: dict | None = None, blobs: dict | None = None,
                timeout: float = 10.0) -> Message:
        frames = encode(msg_type, fields, blobs)
        reply = self.raw(frames, timeout)
        if reply.type == "Error":
            raise RemoteError(reply["code"], reply["message"])
        return reply

    def close(self) -> None:
        self.sock.close(0)
