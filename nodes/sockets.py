"""The one socket factory: bind/connect, high-water marks, linger, heartbeats.

ROUTER sockets set ROUTER_MANDATORY, so a send to a peer that is gone raises
(zmq.ZMQError EHOSTUNREACH) instead of vanishing; ZMTP heartbeats notice a dead peer
on an idle connection. High-water marks bound every queue: a full queue blocks or
fails the sender (back-pressure), it never drops silently.
"""

from __future__ import annotations

import zmq

HWM = 10_000  # messages queued per peer before senders feel back-pressure
HEARTBEAT_IVL_MS = 1000
HEARTBEAT_TIMEOUT_MS = 5000


def _common(sock: zmq.Socket) -> zmq.Socket:
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SNDHWM, HWM)
    sock.setsockopt(zmq.RCVHWM, HWM)
    sock.setsockopt(zmq.HEARTBEAT_IVL, HEARTBEAT_IVL_MS)
    sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, HEARTBEAT_TIMEOUT_MS)
    sock.setsockopt(zmq.HEARTBEAT_TTL, HEARTBEAT_TIMEOUT_MS)
    return sock


def router(ctx: zmq.Context, bind: str) -> tuple[zmq.Socket, str]:
    """A request socket bound at `bind` (tcp://HOST:PORT, port 0 or * for a free one);
    returns it and the address it actually bound."""
    sock = _common(ctx.socket(zmq.ROUTER))
    sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
    host, _, port = bind.rpartition(":")
    if port in ("0", "*"):
        port = sock.bind_to_random_port(host)
        return sock, f"{host}:{port}"
    sock.bind(bind)
    return sock, bind


def dealer(ctx: zmq.Context, connect: str, identity: bytes | None = None) -> zmq.Socket:
    sock = _common(ctx.socket(zmq.DEALER))
    if identity:
        sock.setsockopt(zmq.IDENTITY, identity)
    sock.connect(connect)
    return sock
