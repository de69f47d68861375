"""What a control-plane node does about its own heap: large buffers mapped apart and
unmapped when freed, and freed memory handed back after a large piece of work.

glibc serves a request above its mmap threshold (128 KiB at first) from a mapping of its
own, but raises the threshold to the size of each mapped buffer it frees: after the first
4 MiB upload chunk, every later one came from the heap, where small objects allocated
between them pin it. The router and storage grew with the chunks a job's input came in
(1M items, 14 chunks: +9 and +18 MiB over 100k's two). A fixed threshold keeps every
message-sized buffer mapped apart, so freeing it unmaps it. Workers keep glibc's default:
the engine's per-step tensors would pay a mapping and its page faults every step."""

from __future__ import annotations

import contextlib
import ctypes
import gc
import logging

log = logging.getLogger(__name__)

M_MMAP_THRESHOLD = -3  # mallopt's parameter number (malloc.h)
LARGE_BUFFER_BYTES = 1 << 20


def _libc():
    try:
        return ctypes.CDLL("libc.so.6")
    except OSError:  # not glibc: its allocator keeps what it keeps
        return None


def map_large_buffers_apart() -> None:
    """Buffers of LARGE_BUFFER_BYTES and more get mappings of their own, for good."""
    libc = _libc()
    if libc is None or not hasattr(libc, "mallopt") or not libc.mallopt(M_MMAP_THRESHOLD, LARGE_BUFFER_BYTES):
        log.info("[memory] the allocator's mmap threshold stays its own (not glibc)")


def freeze_startup_heap() -> None:
    """Objects alive once a node is up (torch, the model, the imported modules: hundreds of
    thousands on a worker) move to the collector's permanent generation. Without it every
    full collection walks them all, and per-item churn triggers one every few thousand
    items: a third of a worker's time on one-token items. They stay reachable for the
    process's life, so nothing is lost by never scanning them."""
    gc.collect()
    gc.freeze()


@contextlib.contextmanager
def heap_frozen_while():
    """In-process work (an engine's `generate` in a script, a benchmark) gets what a node
    gets from `freeze_startup_heap` while it runs: what is alive at its start leaves the
    collector's generations, and comes back at its end, so that objects which become
    garbage in cycles later (an engine dropped by its caller) are still collected. A full
    collection walks every tracked object (300,000 with torch and a model loaded: ~140 ms
    here), and a step loop over a thousand sequences made one every 30 steps, a fifth of
    each step's host time. Nothing is done where the heap is frozen already (a node's
    process, a call within a call)."""
    if gc.get_freeze_count():
        yield
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def give_back_memory() -> None:
    """Freed per-item state goes back to the system, not only to Python's and glibc's
    free lists (a storage node that held a million items' state would otherwise keep
    the high-water mark for good)."""
    gc.collect()
    libc = _libc()
    if libc is not None and hasattr(libc, "malloc_trim"):
        libc.malloc_trim(0)
