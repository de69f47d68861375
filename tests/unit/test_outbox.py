"""The outbox (requests from a loop that must not block) and the latency histogram,
against a real ROUTER socket in this process."""

from __future__ import annotations

import time

import zmq

from shoal.transport import sockets
from shoal.nodes.latency_histogram import LatencyHistogram, percentile, window
from shoal.transport.outbox import Outbox, Request
from shoal.protocol.codec import decode, encode


def _serve(router, answer, until, outbox):
    """Runs the loop: the router answers with `answer(msg)` (None: stays silent)."""
    poller = zmq.Poller()
    poller.register(router, zmq.POLLIN)
    end = time.monotonic() + 5
    while not until() and time.monotonic() < end:
        for s in outbox.new_sockets:
            poller.register(s, zmq.POLLIN)
        outbox.new_sockets.clear()
        for sock, _ in poller.poll(10):
            if sock is router:
                identity, *frames = router.recv_multipart()
                msg = decode(frames)
                reply = answer(msg)
                if reply is not None:
                    router.send_multipart([identity, *reply])
            else:
                outbox.take_replies(sock)
        outbox.resend_due(time.monotonic())


def test_refused_request_is_sent_again_until_acknowledged():
    ctx = zmq.Context()
    router, address = sockets.router(ctx, "tcp://127.0.0.1:0")
    outbox = Outbox(ctx, timeout_s=1.0)
    seen, acked = [], []

    def answer(msg):
        seen.append(msg["sent_at"])
        if len(seen) < 3:
            return encode("Error", {"code": "unavailable", "message": "busy"}, reply_to=msg.id)
        return encode("Pong", {"sent_at": msg["sent_at"]}, reply_to=msg.id)

    outbox.send(Request(lambda: address, "Ping", {"sent_at": 1.0}, on_reply=lambda r: acked.append(r["sent_at"])))
    _serve(router, answer, lambda: acked, outbox)
    assert acked == [1.0] and len(seen) == 3 and len(outbox) == 0
    outbox.close()
    ctx.destroy(0)


def test_unanswered_request_gives_up_after_max_tries_and_follows_a_new_address():
    ctx = zmq.Context()
    silent, silent_address = sockets.router(ctx, "tcp://127.0.0.1:0")
    live, live_address = sockets.router(ctx, "tcp://127.0.0.1:0")
    outbox = Outbox(ctx, timeout_s=0.2)
    gave_up = []
    outbox.send(Request(lambda: silent_address, "Ping", {"sent_at": 2.0}, on_error=lambda r: gave_up.append(r) or True,
                        max_tries=2))
    _serve(silent, lambda msg: None, lambda: gave_up, outbox)
    assert gave_up == [None] and len(outbox) == 0

    # A followed request re-sent at once when its address changes (not after the timeout).
    outbox.timeout_s = 30.0
    where, acked = [silent_address], []
    outbox.send(Request(lambda: where[0], "Ping", {"sent_at": 3.0}, on_reply=lambda r: acked.append(time.monotonic()),
                        follow=True))
    outbox.resend_due(time.monotonic())  # sent to the silent one; no answer comes
    where[0] = live_address
    start = time.monotonic()
    _serve(live, lambda msg: encode("Pong", {"sent_at": msg["sent_at"]}, reply_to=msg.id), lambda: acked, outbox)
    assert acked and acked[0] - start < 2.0
    outbox.close()
    ctx.destroy(0)


def test_latency_histogram_percentiles_within_five_percent():
    h = LatencyHistogram()
    before = h.snapshot()
    for ms in range(1, 101):  # 1..100 ms
        h.add(ms / 1000)
    counts = window(before, h.snapshot())
    assert sum(counts) == 100
    for q, exact in ((50, 0.050), (99, 0.099)):
        got = percentile(counts, q)
        assert exact <= got <= exact * 1.05 + 1e-12
    assert percentile([0] * len(counts), 50) is None
