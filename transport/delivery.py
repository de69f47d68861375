"""Sending until acknowledged, from a thread that may wait: the one retry loop behind
every result, checkpoint, progress report and text read a worker delivers.

Receivers deduplicate by the ids inside a request, so a second copy is harmless; the
address is asked before each try and while a try waits, so a request follows a node
that moved (a new leader, a storage node restarted elsewhere) instead of waiting out
its timeout on the old one.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import zmq

from shoal.protocol.codec import Message
from shoal.transport.rpc import DEFAULT_TIMEOUT_S, RemoteError, RpcClient

log = logging.getLogger(__name__)

MAX_BACKOFF_S = 2.0


class RpcClients:
    """One RpcClient per address, made on first use (a client is one DEALER socket:
    keep one per thread that uses it)."""

    def __init__(self, ctx: zmq.Context):
        self.ctx = ctx
        self.clients: dict[str, RpcClient] = {}

    def __call__(self, address: str) -> RpcClient:
        client = self.clients.get(address)
        if client is None:
            client = self.clients[address] = RpcClient(address, self.ctx)
        return client


def deliver(clients: RpcClients, address: Callable[[], str | None], msg_type: str, fields: dict,
            stop: threading.Event, blobs: dict | None = None, timeout: float = DEFAULT_TIMEOUT_S,
            what: str = "") -> Message | None:
    """Sends until acknowledged, with capped backoff; returns the reply, or None if
    `stop` was set or `address()` names nowhere."""
    backoff = 0.1
    while not stop.is_set():
        to = address()
        if not to:
            return None
        try:
            # Abandoned when stopping too: the caller's thread is joined before its sockets close.
            return clients(to).request(msg_type, fields, blobs, timeout=timeout,
                                       abandon=lambda: stop.is_set() or address() != to)
        except (TimeoutError, RemoteError, OSError) as e:
            if stop.is_set():
                return None
            log.warning("[deliver] %s to %s not acknowledged (%s); retrying", what or msg_type, to, e)
            time.sleep(backoff)
            backoff = min(backoff * 2, MAX_BACKOFF_S)
    return None
