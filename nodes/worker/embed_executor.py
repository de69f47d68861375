"""Runs the Embed operations of program coroutines on the worker's encoder, through the
worker's `EncodeQueue` (so their texts share encoder calls with Retrieve queries, as
the encode planner decides); each operation gets its vectors back in its own order."""

from __future__ import annotations


class EmbedExecutor:
    def __init__(self, queue):
        self.queue = queue
        self._done: list = []  # (key, vectors as lists, or an exception)

    def submit(self, key, op) -> None:
        def done(result):
            self._done.append((key, result if isinstance(result, Exception) else result.tolist()))

        self.queue.put(key, list(op.texts), done)

    def abort(self, key) -> None:
        self.queue.cancel(key)
        self._done = [(k, r) for k, r in self._done if k != key]

    def poll(self) -> list:
        out, self._done = self._done, []
        return out
