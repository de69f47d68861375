"""Seeded network faults, injected where every socket is made (`sockets.py`).

A plan drops, duplicates, delays and reorders outgoing messages, per message type, from
a seeded generator, so a test (or a soak run) can show that delivery is at least once
and that no duplicate is ever visible. It is off unless `SHOAL_FAULTS` holds a plan:

    SHOAL_FAULTS='{"seed": 7, "drop": 0.05, "duplicate": 0.05, "delay": 0.1, "delay_ms": 200,
                   "reorder": 0.05, "types": ["WriteResults", "ProgressReport"]}'

`types` (optional) limits the faults to those message types; without it every message
but the handshake is fair game. `stall_after_steps` wedges a worker's step loop (its
watchdog must notice). `park_at` ({"item id": n}) makes a worker set a sequence of
that item aside once it has sampled n tokens of an operation (0: when it is queued),
until it leaves the worker: a test moves or kills it at a position of its choosing, not
of timing's. `step_error` makes a worker's model runs raise (`step_faults.py`): a lost
device, running out of memory, or a bug that one item's sequence triggers. Faults apply on send, so both requests and replies can
be lost. A reordered message is held back and sent after the next one on its socket.
"""

from __future__ import annotations

import logging
import os
import random
import time
from dataclasses import dataclass, field

import orjson

log = logging.getLogger(__name__)

ENV = "SHOAL_FAULTS"
SPARED = frozenset({"Hello", "Ready"})  # the handshake stays reliable, like a real TCP connect
INJECTED = {"drop": 0, "duplicate": 0, "delay": 0, "reorder": 0}  # by every socket of this process


@dataclass
class FaultPlan:
    seed: int = 0
    drop: float = 0.0
    duplicate: float = 0.0
    delay: float = 0.0
    delay_ms: float = 100.0
    reorder: float = 0.0
    types: frozenset | None = None
    stall_after_steps: int | None = None  # a worker's step loop wedges after this many steps
    park_at: dict | None = None  # item id -> tokens after which a worker sets that sequence aside
    step_error: dict | None = None  # model runs that raise (nodes/worker/step_faults.py)
    rng: random.Random = field(default=None, repr=False)

    def __post_init__(self):
        for name in ("drop", "duplicate", "delay", "reorder"):
            p = getattr(self, name)
            if not 0.0 <= p <= 1.0:
                raise ValueError(f"{ENV}: {name} must be a probability in [0, 1], got {p}")
        self.rng = random.Random(self.seed)

    @classmethod
    def from_env(cls) -> "FaultPlan | None":
        raw = os.environ.get(ENV)
        if not raw:
            return None
        try:
            spec = orjson.loads(raw)
            types = spec.pop("types", None)
            plan = cls(**spec, types=frozenset(types) if types else None)
        except (orjson.JSONDecodeError, TypeError) as e:
            raise ValueError(f"{ENV} is not a valid fault plan: {e}") from None
        plan.rng = random.Random(f"{plan.seed}/{os.getpid()}")  # each process its own stream
        return plan

    def applies_to(self, msg_type: str) -> bool:
        return msg_type not in SPARED and (self.types is None or msg_type in self.types)


def _msg_type(header: bytes) -> str:
    try:
        return orjson.loads(bytes(header)).get("type", "")
    except (orjson.JSONDecodeError, AttributeError):
        return ""


class FaultySocket:
    """A ZeroMQ socket whose sends pass through a fault plan; everything else is the socket's."""

    def __init__(self, sock, plan: FaultPlan, routed: bool):
        self._sock = sock
        self._plan = plan
        self._routed = routed  # ROUTER frames start with the peer's identity
        self._held: list | None = None
        self.injected = {"drop": 0, "duplicate": 0, "delay": 0, "reorder": 0}

    def _count(self, kind: str) -> None:
        self.injected[kind] += 1
        INJECTED[kind] += 1

    def __getattr__(self, name):
        return getattr(self._sock, name)

    def send_multipart(self, frames, *args, **kw):
        plan, rng = self._plan, self._plan.rng
        header = frames[1] if self._routed else frames[0]
        if not plan.applies_to(_msg_type(header)):
            return self._send(frames, *args, **kw)
        if rng.random() < plan.drop:
            self._count("drop")
            return None
        if rng.random() < plan.delay:
            self._count("delay")
            time.sleep(rng.random() * plan.delay_ms / 1000)
        if self._held is None and rng.random() < plan.reorder:
            self._count("reorder")
            self._held = [bytes(f) for f in frames]
            return None
        sent = self._send(frames, *args, **kw)
        if rng.random() < plan.duplicate:
            self._count("duplicate")
            self._send(frames, *args, **kw)
        return sent  # an asyncio socket's future for the message itself

    def _send(self, frames, *args, **kw):
        sent = self._sock.send_multipart(frames, *args, **kw)
        if self._held is not None:
            held, self._held = self._held, None
            self._sock.send_multipart(held, *args, **kw)
        return sent
