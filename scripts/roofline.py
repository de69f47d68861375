"""The least time a generation job can take on this machine: its matrix multiplies at the
measured matmul ceiling, plus its decode steps' KV-cache reads at the measured memory
read rate.

A decode step reads every running sequence's whole cache (keys and values of every
layer) once for one new token each; at a W1 decode batch that is hundreds of MB per step,
far beyond the caches, so attention runs at the memory bus, not at the matmul rate. The
floor adds the two (a step runs its layers' matmuls and attention one after the other
on the same cores) and leaves out what is small beside them (norms, sampling, prefill
attention, whose keys are hot in cache). A job's time over this floor is what an engine
could still win; the floor's matmul share is the highest share of the matmul ceiling any
engine can reach on this job here.
"""

from __future__ import annotations

import time


def memory_read_gbps(threads: int, gib: float = 1.0) -> float:
    """GB/s of streaming reads from memory: the best of 5 sums over a buffer far larger
    than the caches (a sum costs far less than its loads, so the bus sets its speed)."""
    import torch

    torch.set_num_threads(threads)
    x = torch.ones(int(gib * 2**30) // 4, dtype=torch.float32)
    x.sum()
    best = 0.0
    for _ in range(5):
        t = time.perf_counter()
        x.sum()
        best = max(best, x.numel() * 4 / (time.perf_counter() - t) / 1e9)
    return best


def decode_cache_bytes(prompt_lens: list[int], output_lens: list[int], layers: int, kv_size: int,
                       elem_bytes: int) -> int:
    """Bytes of KV cache the decode steps of a job read: output token t >= 1 of a sequence
    with a P-token prompt attends its P + t cached keys and values in every layer (token
    0 comes from the prefill)."""
    per_token = layers * 2 * kv_size * elem_bytes
    keys = sum((n - 1) * p + (n - 1) * n // 2 for p, n in zip(prompt_lens, output_lens) if n > 0)
    return keys * per_token


def floor_seconds(flops: float, ceiling_gflops: float, cache_bytes: int, read_gbps: float) -> dict:
    """The floor and its two parts, in seconds."""
    matmul = flops / (ceiling_gflops * 1e9)
    cache = cache_bytes / (read_gbps * 1e9)
    return {"matmul_s": matmul, "cache_s": cache, "floor_s": matmul + cache, "max_matmul_share": matmul / (matmul + cache)}
