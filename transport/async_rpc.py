"""Request/reply to one node from an asyncio loop: many requests in flight on one DEALER
socket, each reply matched to its request by id (a late reply to a request that timed
out is dropped)."""

from __future__ import annotations

import asyncio
import inspect
import logging

import zmq.asyncio

from shoal.transport import sockets
from shoal.protocol.codec import Message, decode, encode, new_message_id
from shoal.protocol.errors import ProtocolError
from shoal.transport.rpc import DEFAULT_TIMEOUT_S, RemoteError

log = logging.getLogger(__name__)


class AsyncRpcClient:
    def __init__(self, address: str, ctx: zmq.asyncio.Context):
        self.address = address
        self.sock = sockets.dealer(ctx, address)
        self.waiting: dict[str, asyncio.Future] = {}
        self.stale = 0
        self._reader = asyncio.get_running_loop().create_task(self._read())

    async def _read(self) -> None:
        while True:
            frames = await self.sock.recv_multipart()
            try:
                reply = decode(frames)
            except ProtocolError as e:
                log.warning("[rpc] undecodable reply from %s: %s", self.address, e)
                continue
            fut = self.waiting.get(reply.reply_to or "")
            if fut is not None and not fut.done():
                fut.set_result(reply)
            else:
                self.stale += 1

    async def request(self, msg_type: str, fields: dict | None = None, blobs: dict | None = None,
                      timeout: float = DEFAULT_TIMEOUT_S, retries: int = 0) -> Message:
        msg_id = new_message_id()
        frames = encode(msg_type, fields, blobs, msg_id=msg_id)
        fut = asyncio.get_running_loop().create_future()
        self.waiting[msg_id] = fut
        try:
            for _ in range(retries + 1):
                sent = self.sock.send_multipart(frames)  # the same id: a reply to any copy answers it
                if inspect.isawaitable(sent):
                    await sent
                try:
                    reply = await asyncio.wait_for(asyncio.shield(fut), timeout)
                except asyncio.TimeoutError:
                    continue
                if reply.type == "Error":
                    raise RemoteError(reply["code"], reply["message"])
                return reply
            raise TimeoutError(f"no reply from {self.address} to {msg_type} within {timeout}s"
                               + (f" ({retries + 1} tries)" if retries else ""))
        finally:
            self.waiting.pop(msg_id, None)

    def close(self) -> None:
        self._reader.cancel()
        self.sock.close(0)
