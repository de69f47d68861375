"""Index searches on a socket and a thread of their own, so that a heavy search never
delays a storage node's write acknowledgements.

The storage node publishes this socket's address as `search_address`; workers send
`SearchIndex` there. Any other message type gets an Error reply naming the socket's
one purpose. The node's main socket answers `SearchIndex` as well (older workers).
"""

from __future__ import annotations

import logging
import threading

import zmq

from shoal.transport import sockets
from shoal.protocol.codec import decode, error_reply
from shoal.protocol.errors import ProtocolError

log = logging.getLogger(__name__)


class SearchServer:
    def __init__(self, node, handler, bind: str, advertise: str):
        self.node, self.handler = node, handler
        host = bind.rpartition(":")[0]
        self.sock, bound = sockets.router(node.ctx, f"{host}:0")
        self.address = f"{advertise.rpartition(':')[0]}:{bound.rpartition(':')[2]}"
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="index-search", daemon=True)
        self._thread.start()

    def _reply(self, frames: list) -> list:
        try:
            msg = decode(frames, self.node.max_message_bytes)
        except ProtocolError as e:
            self.node.counters[f"errors.{e.code}"] += 1
            return error_reply(e)
        if msg.type != "SearchIndex":
            return error_reply(ProtocolError(ProtocolError.UNKNOWN_TYPE, "the search socket answers SearchIndex only; "
                                             "send other messages to the node's address"), about=msg.type, reply_to=msg.id)
        try:
            return self.handler(msg)
        except Exception as e:  # a bad search fails its request, never the thread
            return self.node.failed(msg, e)

    def _serve(self) -> None:
        while not self._stop.is_set():
            if not self.sock.poll(200):
                continue
            try:
                frames = self.sock.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                continue
            reply = self._reply([f.buffer for f in frames[1:]])
            try:
                self.sock.send_multipart([frames[0].bytes, *reply])
            except zmq.ZMQError as e:  # the peer is gone
                log.info("[search] reply dropped: %s", e)
        self.sock.close(0)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)
