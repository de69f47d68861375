"""The one socket factory: bind/connect, high-water marks, linger, heartbeats.

ROUTER sockets set ROUTER_MANDATORY, so a send to a peer that is gone raises
(zmq.ZMQError EHOSTUNREACH) instead of vanishing; ZMTP heartbeats notice a dead peer
on an idle connection. High-water marks bound every queue: a full queue blocks or
fails the sender (back-pressure), it never drops silently. With a fault plan in the
environment (`faults.py`), every socket made here injects seeded network faults; with
CURVE keys (`curve.py`), every connection is encrypted and authenticated.
"""

from __future__ import annotations

import zmq

from shoal.transport import curve
from shoal.transport.faults import FaultPlan, FaultySocket

FROM_ENV = object()  # keys argument: read SHOAL_CURVE_KEYS

HWM = 10_000  # messages queued per peer before senders feel back-pressure
HEARTBEAT_IVL_MS = 1000
HEARTBEAT_TIMEOUT_MS = 5000

_plan: FaultPlan | None = None
_plan_read = False


def fault_plan() -> FaultPlan | None:
    global _plan, _plan_read
    if not _plan_read:
        _plan, _plan_read = FaultPlan.from_env(), True
    return _plan


_env_keys: list = []


def resolve_keys(keys) -> "curve.CurveKeys | None":
    if keys is FROM_ENV:
        if not _env_keys:
            _env_keys.append(curve.CurveKeys.from_env())
        return _env_keys[0]
    return keys


def _faulty(sock: zmq.Socket, routed: bool):
    plan = fault_plan()
    return FaultySocket(sock, plan, routed) if plan is not None else sock


def _common(sock: zmq.Socket) -> zmq.Socket:
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SNDHWM, HWM)
    sock.setsockopt(zmq.RCVHWM, HWM)
    sock.setsockopt(zmq.HEARTBEAT_IVL, HEARTBEAT_IVL_MS)
    sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, HEARTBEAT_TIMEOUT_MS)
    sock.setsockopt(zmq.HEARTBEAT_TTL, HEARTBEAT_TIMEOUT_MS)
    return sock


def router(ctx: zmq.Context, bind: str, keys=FROM_ENV) -> tuple[zmq.Socket, str]:
    """A request socket bound at `bind` (tcp://HOST:PORT, port 0 or * for a free one);
    returns it and the address it actually bound."""
    sock = _common(ctx.socket(zmq.ROUTER))
    sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
    if (k := resolve_keys(keys)) is not None:
        curve.serve_with(sock, ctx, k)
    host, _, port = bind.rpartition(":")
    if port in ("0", "*"):
        port = sock.bind_to_random_port(host)
        return _faulty(sock, True), f"{host}:{port}"
    sock.bind(bind)
    return _faulty(sock, True), bind


def dealer(ctx: zmq.Context, connect: str, identity: bytes | None = None, keys=FROM_ENV) -> zmq.Socket:
    sock = _common(ctx.socket(zmq.DEALER))
    if (k := resolve_keys(keys)) is not None:
        curve.connect_with(sock, k)
    if identity:
        sock.setsockopt(zmq.IDENTITY, identity)
    sock.connect(connect)
    return _faulty(sock, False)


def raw(sock):
    """The ZeroMQ socket itself, under a fault-injecting wrapper if there is one: what a
    zmq.Poller can register (faults apply to sends; receiving from either is the same)."""
    return getattr(sock, "_sock", sock)


def close_context(ctx: zmq.Context) -> None:
    """Destroys a node's context with every socket in it (its authenticator first)."""
    curve.release(ctx)
    ctx.destroy(linger=0)
