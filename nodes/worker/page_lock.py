"""Host memory page-locked in place for a GPU's copies (`cuMemHostRegister`).

A copy from page-locked ("pinned") host memory is DMA that does not hold the host; from
pageable memory CUDA stages it through a buffer of its own, and the host waits. torch's
`pin_memory()` allocates fresh locked memory through a caching allocator that rounds
every request up to a power of two so that freed blocks can be reused: a 24 MB weight
takes 32 MB and a 12 GiB arena 16, all of it locked (never swapped, never reclaimed).
Memory that is allocated once and kept (a streamed layer's weights, the host KV pool)
is better allocated as usual and registered as it is: that locks what it holds and no
more.
"""

from __future__ import annotations

import ctypes
import functools
import weakref

import torch

CU_MEMHOSTREGISTER_PORTABLE = 1


@functools.cache
def _driver():
    """The CUDA driver library, through which memory is registered: a failed call of the
    runtime's `cudaHostRegister` would leave its error pending on the thread, and torch's
    next kernel launch would raise it as its own; the driver's calls leave nothing behind."""
    lib = ctypes.CDLL("libcuda.so.1")
    lib.cuMemHostRegister_v2.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint]
    lib.cuMemHostUnregister.argtypes = [ctypes.c_void_p]
    return lib


def page_lock(ptr: int, size: int) -> str | None:
    """Registers host memory with CUDA (locked, mapped for DMA); None when it took, else
    why not."""
    try:
        torch.cuda.synchronize()  # (makes this thread's CUDA context current for the driver's call)
        err = _driver().cuMemHostRegister_v2(ptr, size, CU_MEMHOSTREGISTER_PORTABLE)
    except Exception as e:  # no driver, torch without CUDA, no device: the memory stays pageable
        return f"{type(e).__name__}: {e}"
    return None if err == 0 else f"cuMemHostRegister returned CUDA error {err}"


def page_unlock(ptr: int) -> None:
    try:
        torch.cuda.synchronize()  # no copy from or to it is still under way on any stream
        _driver().cuMemHostUnregister(ptr)
    except Exception:
        pass  # the process is ending: its CUDA context, and the registrations with it, go too


def _unlock_then_free(unlock, ptr: int, tensor: torch.Tensor) -> None:
    # The finalizer holds `tensor` until here: the memory stays allocated while it is registered.
    unlock(ptr)
    del tensor


PAGE = 4096


def page_aligned(nbytes: int) -> torch.Tensor:
    """`nbytes` (rounded up to whole pages) of host memory that begins on a page boundary,
    as uint8. Why: the driver locks whole pages, and refuses a range that shares a page
    with one already registered (CUDA error 712); two buffers malloc placed side by side
    (streamed layers below glibc's mmap threshold) can share one."""
    size = -(-max(nbytes, 1) // PAGE) * PAGE
    raw = torch.empty(size + PAGE, dtype=torch.uint8)
    skip = -raw.data_ptr() % PAGE
    return raw[skip:skip + size]


def lock_for_life(owner: object, tensor: torch.Tensor, lock=page_lock, unlock=page_unlock) -> str | None:
    """Page-locks a contiguous host tensor's memory until `owner` is freed (then unlocks
    it, and only then lets it go); None when it took, else why not (the memory stays
    pageable: copies from it are still right, no longer asynchronous)."""
    why = lock(tensor.data_ptr(), tensor.numel() * tensor.element_size())
    if why is None:
        weakref.finalize(owner, _unlock_then_free, unlock, tensor.data_ptr(), tensor).atexit = False
    return why
