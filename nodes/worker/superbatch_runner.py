"""SuperBatches on a worker: fetched, encoded, handed on.

The scheduler assigns a SuperBatch as a descriptor (its slices: partition and row
range). A reader thread asks storage for its texts and tokenizes them (off the compute
thread, which meanwhile encodes the previous one); the compute thread sorts it by
token length, encodes one micro-batch (cut by a token budget) per step, so generation
steps of the same worker interleave with it, and once every text is encoded puts the
vectors back in row order as an Arrow table for the result writer.

Memory: the scheduler keeps at most a few SuperBatches in flight per worker, each at
most B_min + n_max texts; `texts_buffered` counts the texts this worker holds (from
fetch until storage acknowledges the vectors) and its high-water mark is reported, so
tests assert the bound rather than trust it.
"""

from __future__ import annotations

import collections
import logging
import queue
import threading
import time
from dataclasses import dataclass, field

import torch

from shoal.protocol.arrow_table import table_to_ipc
from shoal.nodes.worker.step_failures import out_of_memory
from shoal.scheduler.superbatch import MIN_TOKEN_BUDGET, micro_batches

log = logging.getLogger(__name__)


@dataclass
class SuperBatchWork:
    job_id: str
    id: str
    slices: list  # [[partition, start, end], ...]
    vector_dtype: str = "float32"
    ids: list = field(default_factory=list)
    partitions: list = field(default_factory=list)
    rows: list = field(default_factory=list)
    tokens: list = field(default_factory=list)
    order: list = field(default_factory=list)  # row indices sorted by token length
    batches: list = field(default_factory=list)  # micro-batches: ranges over `order`
    next_batch: int = 0
    out: torch.Tensor | None = None
    truncated: int = 0
    encode_s: float = 0.0

    @property
    def size(self) -> int:
        return sum(end - start for _, start, end in self.slices)


class SuperBatchRunner:
    def __init__(self, encoder, fetch, token_budget: int | None = None, counters=None):
        """`fetch(job_id, slices)` -> [(id, text), ...] in slice order (retries inside),
        or None when the read was abandoned (the node is stopping)."""
        self.encoder, self.fetch = encoder, fetch
        self.token_budget = token_budget or encoder.token_budget
        self.counters = counters if counters is not None else collections.Counter()
        self.assigned: queue.Queue = queue.Queue()
        self.ready: collections.deque = collections.deque()
        self.held: dict[tuple, int] = {}  # (job_id, sb id) -> texts; assigned until acknowledged
        self.fetched: dict[tuple, int] = {}  # texts fetched and not yet acknowledged by storage
        self.highwater = {"texts_buffered": 0, "superbatches_held": 0}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._wake = threading.Event()  # set when a SuperBatch is ready to encode
        self._reader = threading.Thread(target=self._read_loop, name="superbatch-reader", daemon=True)
        self._reader.start()

    # -- IO thread ---------------------------------------------------------------------------

    def assign(self, job_id: str, sb: dict, vector_dtype: str) -> bool:
        """Takes a SuperBatch unless it is held already (a re-sent assignment)."""
        key = (job_id, sb["id"])
        with self._lock:
            if key in self.held:
                return False
            work = SuperBatchWork(job_id, sb["id"], [list(s) for s in sb["slices"]], vector_dtype)
            self.held[key] = work.size
            self._mark("superbatches_held", len(self.held))
        self.assigned.put(work)
        return True

    def held_by_job(self) -> dict[str, list]:
        with self._lock:
            out: dict[str, list] = {}
            for job_id, sb_id in self.held:
                out.setdefault(job_id, []).append(sb_id)
            return out

    def _mark(self, name: str, value: int) -> None:
        if value > self.highwater[name]:
            self.highwater[name] = value

    # -- reader thread -----------------------------------------------------------------------

    def _read_loop(self) -> None:
        while not self._stop.is_set():
            try:
                work = self.assigned.get(timeout=0.5)
            except queue.Empty:
                continue
            with self._lock:
                if (work.job_id, work.id) not in self.held:  # dropped meanwhile
                    continue
            try:
                if not self._load(work):  # abandoned: the node is stopping
                    self.assigned.put(work)
                    return
                with self._lock:
                    if (work.job_id, work.id) not in self.held:  # dropped while it was read
                        self.fetched.pop((work.job_id, work.id), None)
                        continue
            except Exception:  # a bug here must not stop the reader: try again later
                self.counters["errors.superbatch_read"] += 1
                log.exception("[embed] reading %s failed; retrying", work.id)
                time.sleep(1.0)
                self.assigned.put(work)
                continue
            self.ready.append(work)
            self._wake.set()

    def _load(self, work: SuperBatchWork) -> bool:
        rows = self.fetch(work.job_id, work.slices)
        if rows is None:
            return False
        if len(rows) != work.size:
            raise RuntimeError(f"{work.id}: storage sent {len(rows)} texts for {work.size} rows")
        with self._lock:
            self.fetched[(work.job_id, work.id)] = work.size
            self._mark("texts_buffered", self.texts_buffered)
        work.ids = [r[0] for r in rows]
        work.partitions = [p for p, start, end in work.slices for _ in range(end - start)]
        work.rows = [i for _, start, end in work.slices for i in range(start, end)]
        work.tokens, work.truncated = self.encoder.tokenize_counted([r[1] for r in rows])
        work.order = sorted(range(len(rows)), key=lambda i: len(work.tokens[i]))
        work.batches = micro_batches([len(work.tokens[i]) for i in work.order], self.token_budget)
        work.out = torch.empty(len(rows), self.encoder.dim)
        return True

    # -- compute thread ----------------------------------------------------------------------

    def has_work(self) -> bool:
        return bool(self.ready)

    def wait(self, timeout: float) -> None:
        self._wake.wait(timeout)
        self._wake.clear()

    def step(self) -> list[tuple[SuperBatchWork, bytes]]:
        """Encodes one micro-batch of the oldest ready SuperBatch; returns the
        SuperBatches it completed with their vectors as an Arrow IPC stream."""
        if not self.ready:
            return []
        work = self.ready[0]
        t = time.perf_counter()
        if work.batches:
            batch = work.batches[work.next_batch]
            rows = work.order[batch.start:batch.stop]
            try:
                work.out[rows] = self.encoder.encode_ids([work.tokens[i] for i in rows])
            except Exception as e:
                if not out_of_memory(e) or len(rows) == 1:
                    raise
                self._split(work, batch, len(rows) * len(work.tokens[rows[-1]]))
                return []
            work.next_batch += 1
        work.encode_s += time.perf_counter() - t
        if work.next_batch < len(work.batches):
            return []
        self.ready.popleft()
        self.counters["embed.texts"] += work.size
        self.counters["embed.truncated"] += work.truncated
        self.counters["embed.superbatches"] += 1
        self.counters["embed.encode_ms"] += int(work.encode_s * 1000)
        log.info("[embed] %s: %d texts in %d micro-batches encoded in %.2fs (%.0f texts/s)", work.id, work.size,
                 len(work.batches), work.encode_s, work.size / max(work.encode_s, 1e-9))
        blob = vectors_ipc(work)
        work.tokens = work.out = None  # only the table travels on
        return [(work, blob)]

    def _split(self, work: SuperBatchWork, batch: range, padded: int) -> None:
        """A micro-batch of `padded` tokens ran the device out of memory: it is encoded
        in two halves, and later micro-batches are planned under half its size (the
        budget stays there: what the device has room for did not grow)."""
        half = batch.start + len(batch) // 2
        work.batches[work.next_batch:work.next_batch + 1] = [range(batch.start, half), range(half, batch.stop)]
        self.counters["embed.oom_splits"] += 1
        budget = max(MIN_TOKEN_BUDGET, padded // 2)
        if budget < self.token_budget:
            log.warning("[embed] %s: out of device memory at a micro-batch of %d padded tokens: split, and "
                        "micro-batches of at most %d tokens from now on (--encoder-token-budget sets it at start)",
                        work.id, padded, budget)
            self.token_budget = budget

    # -- result writer thread ----------------------------------------------------------------

    @property
    def texts_buffered(self) -> int:
        return sum(self.fetched.values())

    def release(self, job_id: str, sb_id: str) -> None:
        """Storage acknowledged the SuperBatch: its texts are gone from this worker."""
        with self._lock:
            self.held.pop((job_id, sb_id), None)
            self.fetched.pop((job_id, sb_id), None)

    def drop_all(self) -> int:
        """Lets go of everything not yet encoded (a lost lease): the scheduler places
        it again. What the result writer holds is still delivered (storage keeps the
        first copy) and released then."""
        with self._lock:
            n = len(self.held)
            self.held.clear()
            for w in self.ready:
                self.fetched.pop((w.job_id, w.id), None)
            self.ready.clear()
        return n

    def close(self) -> None:
        """Stops the reader and waits for it (its fetch is abandoned within a moment once
        the node stops): the node closes the reader's sockets next."""
        self._stop.set()
        self._reader.join(timeout=2.0)


def vectors_ipc(work: SuperBatchWork) -> bytes:
    """The SuperBatch as an Arrow IPC stream: id, partition, row, vector (fixed size)."""
    import pyarrow as pa

    out = work.out
    if work.vector_dtype == "float16":
        out = out.to(torch.float16)
    flat = pa.array(out.reshape(-1).numpy())
    table = pa.table({"id": pa.array(work.ids, pa.string()), "partition": pa.array(work.partitions, pa.string()),
                      "row": pa.array(work.rows, pa.int64()),
                      "vector": pa.FixedSizeListArray.from_arrays(flat, out.shape[1] if out.ndim == 2 else 0)})
    return table_to_ipc(table)
