"""CPU tensors on 2 MB pages where Linux hands them out, for the KV cache.

The cache is gigabytes, and a decode step reads it in 8 KB blocks scattered across all
of it: on 4 KB pages nearly every block costs a TLB miss and a page walk, and a prefill
step's first write to fresh blocks takes a page fault per 4 KB. Asked for 2 MB pages
(`madvise(MADV_HUGEPAGE)`, honoured where transparent huge pages are `always` or
`madvise`, the common default), the same memory costs 512 times fewer of both.
Memory is still committed only where it is first written, in 2 MB steps (the engine
writes the cache's first 4 GiB at start unless told not to: `EngineConfig.kv_prefault`). Anywhere the
advice is unknown or refused, this is `torch.empty`.
"""

from __future__ import annotations

import logging
import math
import mmap

import torch

log = logging.getLogger(__name__)

HUGE_PAGE = 2 << 20


def empty(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """An uninitialized CPU tensor whose memory starts on a 2 MB boundary and is advised
    to use 2 MB pages (a plain `torch.empty` under a megabyte, or where not possible)."""
    nbytes = math.prod(shape) * dtype.itemsize
    advice = getattr(mmap, "MADV_HUGEPAGE", None)
    if advice is None or nbytes < HUGE_PAGE // 2:
        return torch.empty(shape, dtype=dtype)
    try:
        # Private and anonymous: shared anonymous memory is shmem, under another THP setting.
        region = mmap.mmap(-1, nbytes + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        region.madvise(advice)
    except (OSError, ValueError) as e:
        log.info("[kv-cache] 2 MB pages not available (%s): 4 KB pages", e)
        return torch.empty(shape, dtype=dtype)
    raw = torch.frombuffer(region, dtype=torch.uint8)  # holds `region` open while any view lives
    start = -raw.data_ptr() % HUGE_PAGE
    return raw[start : start + nbytes].view(dtype).view(shape)
