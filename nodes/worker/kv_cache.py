"""The KV cache tensors: one `[2, num_blocks * block_size, kv_heads, head_dim]` per layer,
in the engine's device memory (host memory on 2 MB pages for a CPU engine)."""

from __future__ import annotations

import logging
import time

import torch

from shoal.nodes.worker import huge_pages
from shoal.nodes.worker.device_copy import host_to_device
from shoal.nodes.worker.models.config import DecoderConfig

log = logging.getLogger(__name__)


def bytes_per_token(cfg: DecoderConfig, dtype: torch.dtype) -> int:
    return 2 * cfg.num_layers * cfg.kv_size * torch.finfo(dtype).bits // 8


# Spans up to this many tokens get their slots computed in Python (a short prompt's prefill, a
# chunk's tail): five tensor ops on a handful of positions cost more than the list.
SHORT_SPAN = 64


def slot_ints(block_table: list[int], start: int, end: int, block_size: int) -> list[int]:
    """Cache slots of positions [start, end) as Python ints: for a short span, cheaper
    than any tensor op."""
    return [block_table[p // block_size] * block_size + p % block_size for p in range(start, end)]

class KVCache:
    def __init__(self, cfg: DecoderConfig, num_blocks: int, block_size: int, dtype: torch.dtype,
                 prefault_bytes: int = 0, device: torch.device | str = "cpu"):
        self.device = torch.device(device)
        self.block_size = block_size
        self.num_blocks = num_blocks
        slots = num_blocks * block_size
        # Allocated uninitialized: no path reads a slot before it is written (the kernel
        # reads each span's own tokens, the reference path pads with a sequence's first
        # token, model_runner.py). On a CPU on 2 MB pages where the OS has them (huge_pages.py).
        shape = (2, slots, cfg.num_kv_heads, cfg.head_dim)
        if self.device.type == "cpu":
            self.layers = [huge_pages.empty(shape, dtype) for _ in range(cfg.num_layers)]
        else:  # device memory is committed when allocated: nothing to prefault
            self.layers = [torch.empty(shape, dtype=dtype, device=self.device) for _ in range(cfg.num_layers)]
            prefault_bytes = 0
        # One write over the lowest blocks' slots now, up to prefault_bytes in all, so that
        # no step pays a page's first write while the job fits them (blocks are handed out
        # lowest first: `block_manager.py`); the rest is committed as blocks are first written.
        commit_slots = min(slots, prefault_bytes // self.bytes_for(1) // block_size * block_size)
        if commit_slots:
            t = time.perf_counter()
            for layer in self.layers:
                layer[:, :commit_slots].zero_()
            log.info("[kv-cache] %.2f of %.2f GiB committed in %.1f s", commit_slots * self.bytes_for(1) / 2**30,
                     self.nbytes / 2**30, time.perf_counter() - t)

    @property
    def nbytes(self) -> int:
        return sum(layer.nbytes for layer in self.layers)

    def slots_of(self, block_table: list[int], start: int, end: int) -> torch.Tensor:
        """Cache slots of token positions [start, end) of a sequence, as a host tensor (a
        step's inputs travel to the device together: `model_runner.stage`)."""
        bs = self.block_size
        if end - start <= SHORT_SPAN:  # one small tensor from a list: a fifth of the tensor ops' overhead
            return torch.tensor(slot_ints(block_table, start, end, bs), dtype=torch.long)
        table = torch.tensor(block_table, dtype=torch.long)
        pos = torch.arange(start, end)
        return table[pos // bs] * bs + pos % bs

    def bytes_for(self, num_tokens: int) -> int:
        """Bytes of K/V that `num_tokens` tokens take in the canonical layout."""
        layer = self.layers[0]
        return len(self.layers) * 2 * num_tokens * layer.shape[-2] * layer.shape[-1] * layer.element_size()

    def read(self, block_table: list[int], num_tokens: int) -> torch.Tensor:
        """A sequence's K/V in the canonical unpaged layout: [layers, 2, tokens, kvh, d], on
        the cache's device."""
        slots = host_to_device(self.slots_of(block_table, 0, num_tokens), self.device)
        layer = self.layers[0]
        out = torch.empty((len(self.layers), 2, num_tokens, *layer.shape[2:]), dtype=layer.dtype, device=self.device)
        for i, layer in enumerate(self.layers):  # into one tensor: not the layers' gathers and their stack
            torch.index_select(layer, 1, slots, out=out[i])
        return out

    def write(self, block_table: list[int], kv: torch.Tensor) -> None:
        """`kv` in the canonical layout, from any device (host KV goes over a layer at a
        time, each copy from pinned memory not waiting for the host)."""
        slots = host_to_device(self.slots_of(block_table, 0, kv.shape[2]), self.device)
        for layer, src in zip(self.layers, kv):  # a layer at a time: the whole sequence never twice on the device
            layer[:, slots] = src.to(self.device, non_blocking=src.is_pinned()).to(layer.dtype)
