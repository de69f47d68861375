"""Host values and tensors onto the engine's device without waiting for it.

With async scheduling the host plans step N+1 while step N runs: any copy that waits
for the stream to drain would wait for N, and the overlap is lost. So the step's small
tensors (row indices, sampling parameters, grammar masks, slot lists) are copied from
pinned memory with `non_blocking`, never with `torch.tensor(..., device=cuda)`, which
synchronizes the stream, nor from pageable memory, which CUDA may stage by waiting for
the stream to reach the copy.
"""

from __future__ import annotations

import torch


def to_device(values: list, device: torch.device, dtype: torch.dtype | None = None) -> torch.Tensor:
    """A few host values (row indices, parameters) as a tensor on `device`, copied without
    waiting for the device (`host_to_device`)."""
    return host_to_device(torch.tensor(values, dtype=dtype), device)


def host_to_device(t: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """A host tensor on `device`, copied without waiting for the device: on a GPU from
    pinned memory (torch's host allocator keeps the block until the copy has read it).
    Why: `torch.tensor(values, device=cuda)` synchronizes the stream, and CUDA may stage
    a copy from pageable memory by waiting for the stream to reach it; either way, with
    async scheduling, the host would wait for the step just launched."""
    device = torch.device(device)
    if device.type != "cuda":
        return t.to(device)
    return t.pin_memory().to(device, non_blocking=True)
