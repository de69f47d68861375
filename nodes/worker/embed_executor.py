"""Runs the Embed operations of program coroutines on the worker's encoder.

Texts of every Embed submitted since the last step are encoded together (sorted by
length and cut into micro-batches by the encoder), once per step of the compute
thread, and each operation gets its vectors back in its own order.
"""

from __future__ import annotations

from shoal.scheduler.superbatch import DEFAULT_TOKEN_BUDGET


class EmbedExecutor:
    def __init__(self, encoder, token_budget: int = DEFAULT_TOKEN_BUDGET):
        self.encoder, self.token_budget = encoder, token_budget
        self._queued: list = []  # (key, texts)

    def submit(self, key, op) -> None:
        self._queued.append((key, list(op.texts)))

    def abort(self, key) -> None:
        self._queued = [(k, t) for k, t in self._queued if k != key]

    def poll(self) -> list:
        if not self._queued:
            return []
        queued, self._queued = self._queued, []
        texts = [t for _, ts in queued for t in ts]
        try:
            vectors = self.encoder.encode(texts, self.token_budget).tolist() if texts else []
        except Exception as e:  # a bad text fails the operations of this batch, not the worker
            return [(key, e) for key, _ in queued]
        out, i = [], 0
        for key, ts in queued:
            out.append((key, vectors[i:i + len(ts)]))
            i += len(ts)
        return out
