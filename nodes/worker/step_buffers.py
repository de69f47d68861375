"""glibc's malloc told to keep the engine's step tensors instead of handing them back.

Every step allocates and frees the same large tensors (each layer's projections at the
step's token count: megabytes apiece). glibc maps a request above its mmap threshold
fresh and unmaps it on free, so each step touches new pages: a minor fault and a zeroed
4 KB page each. The threshold does rise to the largest block freed so far, but never
past 32 MiB; free heap memory above the trim threshold goes back to the kernel; and a
thread other than the main one (a worker's compute thread) allocates from heaps of 64
MiB that are unmapped whole as soon as they are empty. Each is faulted in again by the
next step. A W3-shaped prefill step (4,096 tokens) took ~129,000 minor faults in one
process and 11,000-24,000 on a worker's compute thread, a fifth of its time or more.
With the mmap threshold fixed at its ceiling, the trim threshold out of reach, a top pad
of a whole heap (an empty heap is kept while the pad would want it) and the decoder's
widest intermediate split below the threshold (`models/decoder.py`): about a hundred.

The cost: the heap keeps a step's peak of transient tensors for the life of the process.
On a C library without `mallopt` (not glibc) nothing changes.
"""

from __future__ import annotations

import ctypes
import logging

log = logging.getLogger(__name__)

M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_THRESHOLD = -1, -2, -3  # glibc's malloc.h
MMAP_THRESHOLD_MAX = 32 << 20  # glibc refuses more on 64-bit (half its 64 MiB heap)
TRIM_THRESHOLD = 2**31 - 1  # mallopt takes an int: 2 GiB, past any step's transient tensors
TOP_PAD = 64 << 20  # a thread arena's heap size: no empty heap is unmapped
# What a single step tensor may take to stay under the threshold, with room for the
# allocator's header and alignment: the decoder splits its MLP rows to fit.
LARGEST_STEP_TENSOR = MMAP_THRESHOLD_MAX // 2

_kept: bool | None = None


def keep_step_buffers() -> bool:
    """Sets malloc's thresholds for this process (once); whether the C library took them."""
    global _kept
    if _kept is None:
        _kept = _set_thresholds()
    return _kept


def _set_thresholds() -> bool:
    try:
        libc = ctypes.CDLL(None)
        mallopt, _ = libc.mallopt, libc.gnu_get_libc_version  # glibc's, not a look-alike's
    except (OSError, AttributeError):
        log.info("[memory] not glibc: malloc thresholds left as they are")
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    ok = mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_MAX) == 1
    ok = mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1 and ok
    ok = mallopt(M_TOP_PAD, TOP_PAD) == 1 and ok
    if not ok:
        log.warning("[memory] glibc refused the malloc thresholds: step tensors page-fault every step")
    return ok


def chunk_rows(rows: int, row_bytes: int) -> int:
    """Rows per piece when `rows` rows of `row_bytes` each are computed in equal pieces
    of at most LARGEST_STEP_TENSOR bytes (all of them when they fit; at least one)."""
    pieces = -(-rows * row_bytes // LARGEST_STEP_TENSOR)
    return max(1, -(-rows // max(1, pieces)))
