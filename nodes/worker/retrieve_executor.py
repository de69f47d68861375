"""Runs the Retrieve operations of program coroutines.

On the compute thread (`submit`, `poll`, once per step): query texts go to the
worker's `EncodeQueue`, which embeds them beside the engine's steps together with
other coroutines' queries and Embed texts (heterogeneous batching: the encode planner
decides how many go in each loop turn), and the vectors go to the retrieval thread.
That thread collects queries for a short window, checks each against the index (k,
encoder, dimension), then sends each shard the whole batch in one call
(`index_client.py`) and hands back each coroutine's hits. A coroutine waiting here
holds no compute and no KV blocks of its own (its prefix stays in the prefix cache,
evictable).
"""

from __future__ import annotations

import logging
import queue
import threading
import time

import numpy as np

log = logging.getLogger(__name__)


class RetrieveExecutor:
    def __init__(self, client, encode_queue=None, window_s: float = 0.002):
        """`encode_queue`: the worker's EncodeQueue (None: no encoder, vector queries only)."""
        self.client, self.encode_queue = client, encode_queue
        self.encoder = encode_queue.encoder if encode_queue is not None else None
        self.window_s = window_s
        self._live: dict = {}  # key -> ticket of its Retrieve in flight (abort drops the key)
        self._tickets = 0
        self._failed: list = []  # (key, ticket, exception) found on the compute thread
        self._queries: queue.Queue = queue.Queue()  # (key, ticket, index, k, vector, embedded here, search params)
        self._done: queue.Queue = queue.Queue()  # (key, ticket, hits or exception)
        self.stats = {"queries": 0, "searches": 0, "search_s": 0.0, "batch_max": 0}
        self._ready = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._search_loop, name="retrieve", daemon=True)
        self._thread.start()

    # -- compute thread ------------------------------------------------------------------

    def submit(self, key, op) -> None:
        self._tickets += 1
        ticket = self._live[key] = self._tickets
        if not isinstance(op.k, int) or isinstance(op.k, bool) or op.k < 1:
            self._failed.append((key, ticket, ValueError(f"Retrieve k must be a positive integer, got {op.k!r}")))
        elif not isinstance(op.index, str):
            self._failed.append((key, ticket, ValueError(f"Retrieve index must be a name, got {op.index!r}")))
        elif any(not isinstance(v, int) or isinstance(v, bool) or v < 1 for v in op.search_params().values()):
            self._failed.append((key, ticket, ValueError(f"Retrieve nprobe and ef must be positive integers, "
                                                         f"got {op.search_params()}")))
        elif isinstance(op.query, str):
            if self.encode_queue is None:
                self._failed.append((key, ticket, ValueError("a text query needs an encoder: this worker hosts none "
                                                             "(start it with --encoder), or give the query as a vector")))
            else:
                def embedded(result, key=key, ticket=ticket, op=op):
                    if isinstance(result, Exception):
                        self._failed.append((key, ticket, result))
                    elif not np.isfinite(result[0]).all():
                        self._failed.append((key, ticket, ValueError("the encoder gave this query a vector with NaN "
                                                                     "or infinite values")))
                    else:
                        self._queries.put((key, ticket, op.index, op.k, result[0], True, op.search_params()))

                self.encode_queue.put(key, [op.query], embedded)
        else:
            try:
                vector = np.asarray(op.query, np.float32)
                if vector.ndim != 1 or not len(vector) or not np.isfinite(vector).all():
                    raise ValueError(f"shape {vector.shape}")
            except (TypeError, ValueError) as e:  # fails this sequence, nothing else
                self._failed.append((key, ticket, ValueError(f"a Retrieve query must be a text or a vector of "
                                                             f"finite numbers ({e})")))
                return
            self._queries.put((key, ticket, op.index, op.k, vector, False, op.search_params()))

    def abort(self, key) -> None:
        self._live.pop(key, None)
        if self.encode_queue is not None:
            self.encode_queue.cancel(key)

    def poll(self) -> list:
        finished, self._failed = self._failed, []
        while True:
            try:
                finished.append(self._done.get_nowait())
            except queue.Empty:
                break
        out = []
        for key, ticket, result in finished:
            if self._live.get(key) == ticket:  # not aborted (or moved and back) meanwhile
                del self._live[key]
                out.append((key, result))
        return out

    # -- retrieval thread ----------------------------------------------------------------

    def _refusal(self, info: dict, name: str, entry) -> Exception | None:
        """Why this index cannot answer this query, if it cannot: k beyond its size, or
        a text query embedded by another encoder than the index's."""
        if entry[3] > info["rows"]:
            return ValueError(f"k={entry[3]} is larger than index {name!r} ({info['rows']} passages)")
        if entry[5] and info["encoder"] != self.encoder.fingerprint:
            return ValueError(f"index {name!r} was built with encoder {info['encoder']} (dimension {info['dim']}); "
                              f"this worker embeds queries with encoder {self.encoder.fingerprint} "
                              f"({self.encoder.folder}): rebuild the index or start workers with its encoder")
        if len(entry[4]) != info["dim"]:
            return ValueError(f"a query of dimension {len(entry[4])} cannot search index {name!r} of dimension {info['dim']}")
        return None

    def _search_loop(self) -> None:
        while not self._stop.is_set():
            try:
                first = self._queries.get(timeout=0.5)
            except queue.Empty:
                continue
            batch = [first]
            deadline = time.monotonic() + self.window_s
            while True:  # a short window lets queries of the next steps join this call
                try:
                    batch.append(self._queries.get(timeout=max(0.0, deadline - time.monotonic())))
                except queue.Empty:
                    break
            groups: dict[str, list] = {}  # one call per index
            for entry in batch:
                groups.setdefault(entry[2], []).append(entry)
            for name, entries in groups.items():
                try:
                    self._search(name, entries)
                except Exception as e:  # a bug here must fail these queries, never stop the thread
                    log.exception("[retrieve] search of index %r failed", name)
                    for key, ticket, *_ in entries:
                        self._done.put((key, ticket, e))
                    self._ready.set()

    def _search(self, name: str, entries: list) -> None:
        t = time.perf_counter()
        try:
            info = self.client.describe(name)
            refused = [self._refusal(info, name, e) for e in entries]
            for (key, ticket, *_), why in zip(entries, refused):
                if why is not None:  # fails its own sequence, not the batch
                    self._done.put((key, ticket, why))
            entries = [e for e, why in zip(entries, refused) if why is None]
            if entries:
                k = max(e[3] for e in entries)  # each takes its own k off the top: same order
                hits = self.client.search(name, np.stack([e[4] for e in entries]), k, [e[6] for e in entries])
                results = [h[:e[3]] for e, h in zip(entries, hits)]
        except Exception as e:  # the index is unreachable: each sequence of the batch records why
            log.warning("[retrieve] %d queries of index %r failed: %s", len(entries), name, e)
            results = [e] * len(entries)
        if not entries:
            self._ready.set()
            return
        self.stats["searches"] += 1
        self.stats["queries"] += len(entries)
        self.stats["batch_max"] = max(self.stats["batch_max"], len(entries))
        self.stats["search_s"] += time.perf_counter() - t
        for (key, ticket, *_), r in zip(entries, results):
            self._done.put((key, ticket, r))
        self._ready.set()

    def wait(self, timeout: float) -> None:
        """Compute thread, with nothing else to do: until some retrieval finishes."""
        if self._done.empty() and not self._failed:
            self._ready.wait(timeout)
        self._ready.clear()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2.0)  # a zmq socket is not closed under another thread's poll
        self.client.close()
