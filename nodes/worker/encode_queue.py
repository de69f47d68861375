"""Texts waiting for the worker's encoder: those of Embed operations and the text
queries of Retrieve operations, from every coroutine.

Texts are tokenized when they arrive. Once per loop turn, after the engine's step, the
runner calls `run`: `scheduler/encode_planner.plan_encode` decides how many of the
oldest texts go now (from the engine step's predicted time, the encoder's cost terms,
and how long the oldest has waited), and those are encoded in one call, cut into
length-sorted micro-batches. A request's texts always go together. The encoder's terms
start from the worker's calibration and are refitted to the calls made here. Compute
thread only.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np

from shoal.nodes.worker.step_failures import out_of_memory, raise_if_device_lost
from shoal.scheduler.embed_prediction import EncoderCost
from shoal.scheduler.encode_planner import plan_encode
from shoal.scheduler.superbatch import MIN_TOKEN_BUDGET, micro_batches

log = logging.getLogger(__name__)

REFIT_CALLS = 64  # the encoder's terms are refitted to this many recent calls
REFIT_MIN = 8
REFIT_EVERY = 8


@dataclass
class _Request:
    key: object
    ids: list[list[int]]
    done: Callable  # called with the vectors (numpy [texts, dim]) or an exception
    waited: int = 0  # loop turns spent queued


class EncodeQueue:
    def __init__(self, encoder, engine=None, cost: dict | None = None, token_budget: int | None = None):
        self.encoder, self.engine = encoder, engine
        self.token_budget = token_budget or encoder.token_budget
        self.cost = EncoderCost(cost["a"], cost["c"], 0.0) if cost else None
        self._calls: list[tuple[int, int, float]] = []  # (micro-batches, padded tokens, seconds), recent
        self._queue: list[_Request] = []
        self.stats = {"encode_s": 0.0, "calls": 0, "texts": 0, "deferred": 0}

    def __len__(self) -> int:
        return len(self._queue)

    def put(self, key, texts: list[str], done: Callable) -> None:
        if not texts:
            done(np.zeros((0, self.encoder.dim), np.float32))
            return
        try:
            ids = self.encoder.tokenize(list(texts))
        except Exception as e:  # a text the tokenizer refuses fails its own request
            done(e)
            return
        self._queue.append(_Request(key, ids, done))

    def cancel(self, key) -> None:
        self._queue = [r for r in self._queue if r.key != key]

    def _observe(self, lengths: list[int], seconds: float) -> None:
        """Refits the encoder's terms to the calls this queue made: the start-up
        calibration fits large micro-batches, and a few short queries cost more per
        call than it says."""
        cuts = micro_batches(lengths, self.token_budget)
        self._calls = self._calls[-(REFIT_CALLS - 1):] + [(len(cuts), sum(len(r) * lengths[r.stop - 1] for r in cuts),
                                                           seconds)]
        if len(self._calls) < REFIT_MIN or len(self._calls) % REFIT_EVERY:
            return
        x = np.array([(m, p) for m, p, _ in self._calls], float)
        y = np.array([t for *_, t in self._calls])
        (a, c), *_ = np.linalg.lstsq(x, y, rcond=None)
        if a > 0 and c > 0:  # shapes too alike to separate the terms: keep what we had
            self.cost = EncoderCost(float(a), float(c), 0.0)
            self.stats["refit"] = {"a": float(a), "c": float(c)}

    def _engine_step_s(self) -> float:
        """The engine's next step, predicted from its last one; 0 when it is idle."""
        e = self.engine
        if e is None or not e.has_unfinished() or getattr(e, "cost_model", None) is None:
            return 0.0
        return e.cost_model.step_time(*e.last_step_work)

    def _encode(self, ids: list[list[int]]) -> np.ndarray:
        """One call; out of device memory, again in micro-batches of half the tokens (and
        so from now on), down to the smallest budget."""
        while True:
            try:
                return self.encoder.encode_tokenized(ids, self.token_budget).float().numpy()
            except Exception as e:
                if not out_of_memory(e) or self.token_budget <= MIN_TOKEN_BUDGET:
                    raise
                self.token_budget = max(MIN_TOKEN_BUDGET, self.token_budget // 2)
                self.stats["oom_halvings"] = self.stats.get("oom_halvings", 0) + 1
                log.warning("[encode] out of device memory: micro-batches of at most %d tokens from now on",
                            self.token_budget)

    def _one_by_one(self, batch: list[_Request], e: Exception) -> None:
        """A call failed: each request again alone, so that only those that fail alone
        (a text the encoder cannot take) fail."""
        if len(batch) == 1:
            batch[0].done(e)
            return
        self.stats["retried_alone"] = self.stats.get("retried_alone", 0) + len(batch)
        for r in batch:
            try:
                vectors = self._encode(r.ids)
            except Exception as alone:
                raise_if_device_lost(alone)
                r.done(alone)
                continue
            r.done(vectors)

    def run(self) -> None:
        if not self._queue:
            return
        lengths = [len(t) for r in self._queue for t in r.ids]
        n = plan_encode(lengths, self._engine_step_s(), self.cost, self.token_budget, self._queue[0].waited)
        take, count = 0, 0
        while take < len(self._queue) and (count < n or take == 0) and n:
            count += len(self._queue[take].ids)
            take += 1
        batch, self._queue = self._queue[:take], self._queue[take:]
        for r in self._queue:
            r.waited += 1
        if not batch:
            self.stats["deferred"] += 1
            return
        ids = [t for r in batch for t in r.ids]
        t = time.perf_counter()
        try:
            vectors = self._encode(ids)
        except Exception as e:  # fails the requests that fail alone, never the worker
            raise_if_device_lost(e)
            self._one_by_one(batch, e)
            return
        finally:
            elapsed = time.perf_counter() - t
            self.stats["encode_s"] += elapsed
        self._observe(sorted(map(len, ids)), elapsed)
        self.stats["calls"] += 1
        self.stats["texts"] += len(vectors)
        i = 0
        for r in batch:
            r.done(vectors[i:i + len(r.ids)])
            i += len(r.ids)
