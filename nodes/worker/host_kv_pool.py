"""Host memory for the KV of preempted sequences: one arena allocated at start
(page-locked on a GPU host, as it is: `page_lock.py`), in which each offloaded sequence
takes a contiguous span in the canonical layout [layers, 2, tokens, kv_heads, head_dim].

On a GPU a preemption gathers the sequence's blocks on the device and copies them to
its span on a copy stream of its own, so the steps that follow do not wait for the
copy; the copy stream first waits for the compute stream (the gather), and whoever
reads a span waits for the copy stream (`for_device`, `for_host`). Pinned memory lets
the copies run by DMA and lets the restore's copy back return at once. The arena is
allocated once: pinning memory per preemption would call the driver each time.

On a CPU the gather writes straight into the span (no second copy), and the arena's
pages are committed only as spans are first written.
"""

from __future__ import annotations

import logging

import torch

from shoal.nodes.worker.device_copy import host_to_device
from shoal.nodes.worker.kv_cache import KVCache
from shoal.nodes.worker.page_lock import lock_for_life, page_aligned
from shoal.nodes.worker.span_allocator import SpanAllocator

log = logging.getLogger(__name__)


class HostKVPool:
    def __init__(self, cache: KVCache, capacity_bytes: int):
        layer = cache.layers[0]
        self.shape = (len(cache.layers), 2, layer.shape[-2], layer.shape[-1])  # per token: [L, 2, ., kvh, d]
        self.token_elems = 2 * len(cache.layers) * layer.shape[-2] * layer.shape[-1]
        self.token_bytes = self.token_elems * layer.element_size()
        self.gpu = cache.device.type == "cuda"
        tokens = max(0, capacity_bytes // self.token_bytes)
        self.arena = page_aligned(tokens * self.token_bytes).view(layer.dtype)[:tokens * self.token_elems]
        if self.gpu and tokens:
            # Locked as it is (`page_lock.py`): pin_memory() would round 12 GiB up to 16.
            why = lock_for_life(self, self.arena)
            if why is not None:
                log.warning("[offload] the host KV pool is left pageable (%s): its copies will hold the host", why)
        self.spans = SpanAllocator(tokens)
        self.stream = torch.cuda.Stream(cache.device) if self.gpu else None

    @property
    def used_bytes(self) -> int:
        return self.spans.used * self.token_bytes

    def offload(self, cache: KVCache, block_table: list[int], num_tokens: int) -> torch.Tensor | None:
        """The sequence's KV, copied into a span of the arena (a view of it), or None where
        no free span is that long."""
        start = self.spans.allocate(num_tokens)
        if start is None:
            return None
        L, two, kvh, d = self.shape
        view = self.arena[start * self.token_elems:(start + num_tokens) * self.token_elems].view(L, two, num_tokens, kvh, d)
        slots = host_to_device(cache.slots_of(block_table, 0, num_tokens), cache.device)  # (not waiting for the step in flight)
        if not self.gpu:
            for i, layer in enumerate(cache.layers):
                torch.index_select(layer, 1, slots, out=view[i])
            return view
        # A layer at a time: gathered on the compute stream, copied on the copy stream. A
        # gather of the whole sequence at once would hold its KV twice on the device (the
        # layers' gathers and their stack), outside what the cache's sizing left free.
        compute = torch.cuda.current_stream(cache.device)
        for i, layer in enumerate(cache.layers):
            kv = layer[:, slots]
            self.stream.wait_stream(compute)
            with torch.cuda.stream(self.stream):
                view[i].copy_(kv, non_blocking=True)
            kv.record_stream(self.stream)  # its memory is not reused before the copy has read it
        return view

    def release(self, view: torch.Tensor) -> None:
        start = (view.storage_offset() - self.arena.storage_offset()) // self.token_elems
        self.spans.release(start, view.shape[2])

    def for_device(self) -> None:
        """The compute stream waits for the copies to host before it reads a span (a
        restore) or a span is reused (the next offload queues after it anyway)."""
        if self.gpu:
            torch.cuda.current_stream(self.stream.device).wait_stream(self.stream)

    def for_host(self) -> None:
        """The host waits for the copies before it reads a span (an export)."""
        if self.gpu:
            self.stream.synchronize()
