"""A node served on an asyncio event loop (uvloop): its handlers may be coroutines, so a
request that waits on another node does not hold up the others.

The router is one: each client request becomes a task, and its forwards to the
scheduler and storage overlap, where a poll loop would answer clients one at a time
(a submit whose input storage checks for a minute would stall every client). Nodes
whose work is local (storage's group commit, the scheduler's table, the worker's
compute thread) keep the plain poll loop of `node.py`.
"""

from __future__ import annotations

import asyncio
import inspect
import logging

import uvloop
import zmq
import zmq.asyncio

from shoal.nodes.node import Node

log = logging.getLogger(__name__)


class AsyncNode(Node):
    def make_context(self) -> zmq.Context:
        return zmq.asyncio.Context()

    async def dispatch_async(self, frames: list) -> list | None:
        msg, err = self.route(frames)
        if msg is None:
            return err
        try:
            reply = self.handlers[msg.type](msg)
            return await reply if inspect.isawaitable(reply) else reply
        except Exception as e:
            return self.failed(msg, e)

    def send(self, identity: bytes, frames: list) -> None:
        sent = self.sock.send_multipart([identity, *frames])
        if isinstance(sent, asyncio.Future):  # ROUTER_MANDATORY errors land in the future
            sent.add_done_callback(self._sent)

    def _sent(self, fut: asyncio.Future) -> None:
        if not fut.cancelled() and fut.exception() is not None:
            self.counters["errors.unroutable"] += 1
            log.info("[%s %s] reply to a vanished peer dropped: %s", self.role, self.node_id, fut.exception())

    async def _handle(self, identity: bytes, frames: list) -> None:
        reply = await self.dispatch_async(frames)
        if reply is not None:
            self.send(identity, reply)

    async def serve(self) -> None:
        log.info("[start] %s %s serving on %s (event loop)", self.role, self.node_id, self.address)
        tasks: set[asyncio.Task] = set()
        while not self._stop.is_set():
            if self.registration is not None and not self.serves_without_lease and not self.registration.alive():
                self.counters["lease_lost"] += 1
                await asyncio.sleep(0.1)  # past our own lease deadline: take no work
                continue
            if not await self.sock.poll(100):
                continue
            while True:
                try:
                    frames = await self.sock.recv_multipart(zmq.NOBLOCK, copy=False)
                except zmq.Again:
                    break
                task = asyncio.create_task(self._handle(frames[0].bytes, [f.buffer for f in frames[1:]]))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
        for task in list(tasks):
            task.cancel()

    def serve_forever(self) -> None:
        try:
            uvloop.run(self.serve())
        finally:
            self.close()
