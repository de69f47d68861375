"""Requests to other nodes from an event loop that must never block: each goes out on a
DEALER socket per address, and is sent again until acknowledged.

The blocking `RpcClient` suits a thread that has nothing else to do while it waits; a
loop serving many sockets (`sim_worker_host.py`) cannot wait on one peer. Here a
request is sent, its reply is matched by id when the loop sees it, and one that timed
out, or was answered with an Error its sender did not claim, is sent again after a
capped backoff, to wherever its address function points then (a progress report
follows the leader). Receivers deduplicate by the ids inside the request, so a second
copy is harmless: delivery is at least once, with idempotent effects.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import zmq

from shoal.transport import sockets
from shoal.protocol.codec import Message, decode, encode, new_message_id
from shoal.protocol.errors import ProtocolError
from shoal.transport.rpc import DEFAULT_TIMEOUT_S

log = logging.getLogger(__name__)

TIMEOUT_S = DEFAULT_TIMEOUT_S
MAX_BACKOFF_S = 2.0


@dataclass
class Request:
    to: Callable[[], str | None]  # where to send it now ("": nowhere yet, try later; None: give up)
    msg_type: str
    fields: dict
    on_reply: Callable[[Message], None] | None = None
    # Called with an Error reply: True claims it (the request is dropped), False
    # (or no handler) sends the request again later. Called with None when max_tries
    # went unanswered (the request is dropped).
    on_error: Callable[[Message | None], bool] | None = None
    max_tries: int | None = None  # None: until acknowledged
    timeout_s: float | None = None  # per try; None: the outbox's
    # Sent again at once when `to()` changes while it waits (a progress report whose
    # leader was replaced): asked on every turn of the loop, so only for cheap `to`s.
    follow: bool = False
    address: str = ""  # where the current try went
    sent_at: float = 0.0  # first send
    due: float = 0.0  # when to send again if no reply has come
    backoff: float = 0.1
    id: str = ""
    tries: int = 0


class Outbox:
    def __init__(self, ctx: zmq.Context, timeout_s: float = TIMEOUT_S):
        self.ctx = ctx
        self.timeout_s = timeout_s
        self.socks: dict[str, zmq.Socket] = {}  # address -> DEALER
        self.in_flight: dict[str, Request] = {}  # message id -> request
        self.later: list[Request] = []  # waiting out a backoff or an address
        self.stale = 0  # replies to a try that was already given up on
        self.resent = 0
        self.new_sockets: list[zmq.Socket] = []  # for the loop to add to its poller

    def send(self, request: Request) -> None:
        request.sent_at = request.sent_at or time.monotonic()
        self._try(request, time.monotonic())

    def _try(self, r: Request, now: float) -> None:
        address = r.to()
        if address is None:
            if r.on_error is not None:
                r.on_error(None)
            return
        if not address:
            r.due = now + r.backoff
            self.later.append(r)
            return
        sock = self.socks.get(address)
        if sock is None:
            sock = self.socks[address] = sockets.dealer(self.ctx, address)
            self.new_sockets.append(sock)
        r.address = address
        r.id = new_message_id()  # a fresh id per try: a late reply to an old one is told apart
        r.tries += 1
        r.due = now + (r.timeout_s or self.timeout_s)
        self.in_flight[r.id] = r
        sock.send_multipart(encode(r.msg_type, r.fields, msg_id=r.id))

    def take_replies(self, sock: zmq.Socket) -> None:
        """Everything waiting on one of this outbox's sockets."""
        while True:
            try:
                frames = sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            try:
                reply = decode(frames)
            except ProtocolError as e:
                log.warning("[outbox] undecodable reply dropped: %s", e)
                continue
            r = self.in_flight.pop(reply.reply_to or "", None)
            if r is None:
                self.stale += 1
                continue
            if reply.type == "Error":
                if r.on_error is not None and r.on_error(reply):
                    continue
                log.info("[outbox] %s to %s refused (%s: %s); again in %.1f s", r.msg_type, r.to(), reply["code"],
                         reply["message"], r.backoff)
                self._later(r, time.monotonic())
                continue
            if r.on_reply is not None:
                r.on_reply(reply)

    def _later(self, r: Request, now: float) -> None:
        r.due = now + r.backoff
        r.backoff = min(r.backoff * 2, MAX_BACKOFF_S)
        self.later.append(r)

    def resend_due(self, now: float) -> None:
        """Sends again what timed out or waited out its backoff."""
        expired = [k for k, r in self.in_flight.items() if r.due <= now or (r.follow and r.to() != r.address)]
        for k in expired:
            r = self.in_flight.pop(k)
            if r.max_tries is not None and r.tries >= r.max_tries:
                log.info("[outbox] %s to %s: no reply after %d tries; given up", r.msg_type, r.to(), r.tries)
                if r.on_error is not None:
                    r.on_error(None)
                continue
            self.resent += 1
            self._try(r, now)
        if self.later:
            due, self.later = [r for r in self.later if r.due <= now], [r for r in self.later if r.due > now]
            for r in due:
                self._try(r, now)

    def __len__(self) -> int:
        return len(self.in_flight) + len(self.later)

    def close(self) -> None:
        for sock in self.socks.values():
            sock.close(0)
