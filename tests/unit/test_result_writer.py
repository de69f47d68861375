"""The result writer names every result it has not stored, queued or in delivery: a
worker that rejoins keeps those sequences held (liveness.py), so a new leader placing
them here again does not run them twice."""

from __future__ import annotations

import collections
import socket
import threading
import time

import pytest
import zmq

from shoal.nodes.worker.result_writer import ResultWriter
from shoal.transport.delivery import RpcClients

pytestmark = pytest.mark.timeout(30)


def silent_address() -> str:
    """A loopback port nobody listens on: every delivery there waits and retries."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"tcp://127.0.0.1:{s.getsockname()[1]}"


def test_unwritten_covers_queued_and_in_flight_results():
    ctx, stop, stored = zmq.Context(), threading.Event(), []
    storage = silent_address()
    writer = ResultWriter("w", RpcClients(ctx), {"j": {"storage": storage}}, lambda job: storage,
                          lambda job_id, ids: stored.append((job_id, ids)), lambda: 0,
                          collections.Counter(), stop)
    for i in range(3):
        writer.put(writer.results, ("j", {"id": i, "text": "x"}, 1))
    writer.put(writer.results, ("k", {"id": "a", "text": "y"}, 1))
    assert writer.unwritten() == {"j": {0, 1, 2}, "k": {"a"}}  # queued, the writer not started
    try:
        writer.start()
        end = time.monotonic() + 10
        while writer.results.qsize():  # taken off the queue: now being delivered, to no one
            assert time.monotonic() < end, "the writer never took the results"
            time.sleep(0.01)
        assert writer.busy() and not stored
        assert writer.unwritten() == {"j": {0, 1, 2}, "k": {"a"}}
    finally:
        stop.set()
        assert writer.join(5.0), "the writer did not leave its delivery once stopped"
        # Abandoned, not acknowledged: still unwritten (the sequences stay held), none reported stored.
        assert writer.unwritten() == {"j": {0, 1, 2}, "k": {"a"}} and not stored
        ctx.destroy(linger=0)
