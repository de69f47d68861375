"""One streamed layer's weights on the host, in one allocation; on a GPU page-locked in
place (`page_lock.py`) so that copies from it are asynchronous DMA, with no more memory
locked than the layer holds. Built a layer at a time, so that while the streamer builds
them the host holds the loaded model and one layer's copy, not two models.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

import torch

from shoal.nodes.worker.page_lock import lock_for_life, page_aligned, page_unlock

log = logging.getLogger(__name__)

ALIGN = 4096  # each weight at a multiple of 4 KB from the allocation's start: aligned for any dtype


class HostLayer:
    _warned = False

    def __init__(self, params: Iterable[tuple[str, torch.Tensor]], lock=None, unlock=page_unlock):
        """Copies `params` (name, tensor: on the host or the device) into one host
        allocation, each a contiguous view at a page boundary (`views`). `lock`: the
        function that page-locks it (`page_lock.page_lock` on a GPU; None on a CPU,
        where copies are memcpys and locking buys nothing). A lock that fails leaves the
        memory pageable (copies still right, no longer asynchronous) and says so once."""
        params = [(name, t.detach()) for name, t in params]
        offsets, total = [], 0
        for _, t in params:
            offsets.append(total)
            total += -(-t.numel() * t.element_size() // ALIGN) * ALIGN
        self.buffer = page_aligned(total)  # its own pages: locking it never meets another's
        self.views: dict[str, torch.Tensor] = {}
        for (name, t), at in zip(params, offsets):
            view = self.buffer[at:at + t.numel() * t.element_size()].view(t.dtype).view(t.shape)
            view.copy_(t)
            self.views[name] = view
        self.nbytes = total
        why = lock_for_life(self, self.buffer, lock, unlock) if lock is not None else "no GPU"
        self.locked = why is None
        if lock is not None and why is not None and not HostLayer._warned:
            HostLayer._warned = True
            log.warning("[stream] host weights left pageable (%s): copies to the GPU will not overlap compute", why)
