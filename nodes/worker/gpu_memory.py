"""The KV cache's size on a GPU: what is left of `gpu_memory_utilization` of the device
once the weights are loaded and a worst-case step has run, as vLLM sizes its cache.

A GPU worker owns its device (one worker per GPU; where a host runs more workers than it
has GPUs, those sharing one split it), so its cache takes the device's memory rather
than a share of the host's: `utilization` (default 0.9) of the device's
total, less everything allocated on it now (this worker's weights and CUDA context,
and any other process's memory), less the peak of transient tensors one step of the
largest budget and its sampling allocate (measured by running one, `profile_step`).
"""

from __future__ import annotations

import logging

log = logging.getLogger(__name__)

DEFAULT_UTILIZATION = 0.9
MIN_KV_BYTES = 64 << 20  # below this no useful batch fits


def check_utilization(share: float) -> float:
    if not 0 < share <= 1:
        raise ValueError(f"--gpu-memory-utilization must be in (0, 1], not {share}")
    return share


def gpu_kv_cache_bytes(total: int, free: int, step_peak: int, utilization: float = DEFAULT_UTILIZATION,
                       share: int = 1, own: int = 0) -> tuple[int, str]:
    """The cache's bytes on a device of `total` bytes of which `free` are free now (after
    the weights), whose steps need `step_peak` bytes beyond that; and why. ValueError
    when nothing useful is left, naming the figures.

    `share` > 1: that many workers were given this GPU (a host with more workers than
    GPUs). Each may fill `utilization / share` of it, less what it holds itself (`own`:
    its weights); the others' memory is theirs, and counting it as in use would leave
    nothing to whichever worker starts last."""
    check_utilization(utilization)
    if share > 1:
        in_use, of = own, f"{utilization:.0%} / {share} workers of the GPU's {total / 2**30:.1f} GiB, less this worker's"
        # Never more than is free (a worker added later to a GPU whose workers took their shares).
        size = min(int(total * utilization / share) - own, int(total * utilization) - (total - free)) - step_peak
    else:
        in_use, of = total - free, f"{utilization:.0%} of the GPU's {total / 2**30:.1f} GiB, less"
        size = int(total * utilization) - in_use - step_peak
    why = (f"{of} {in_use / 2**30:.2f} GiB in use{' (weights, CUDA context, other processes)' if share <= 1 else ''} "
           f"and {step_peak / 2**30:.2f} GiB for a step's activations")
    if size < MIN_KV_BYTES:
        raise ValueError(f"no room for a KV cache on the GPU: {why} leaves {size / 2**20:.0f} MiB; raise "
                         "--gpu-memory-utilization, free the device, or give --kv-cache-bytes")
    return size, why


def profile_step(model, kv_dtype, ops, tokens: int, rows: int, block_size: int) -> int:
    """Bytes a step of `tokens` prompt tokens with `rows` sampled rows allocates beyond
    what the device holds before it (its activations, logits and the sampler's
    temporaries), measured by running one on a small cache of its own."""
    import torch

    from shoal.nodes.worker.kv_cache import KVCache
    from shoal.nodes.worker.model_runner import ModelRunner
    from shoal.nodes.worker.sampler import sample
    from shoal.nodes.worker.sequence import Sequence
    from shoal.sampling import SamplingParams

    device = model.embed.weight.device
    rows = max(1, min(rows, tokens))
    per = -(-tokens // rows)  # `rows` sequences sharing the step's tokens, each sampling once
    blocks = rows * -(-per // block_size)
    cache = KVCache(model.cfg, blocks, block_size, kv_dtype, device=device)
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)  # after its own small cache: that is not a step's
    runner = ModelRunner(model, cache, ops)
    seqs = []
    for i in range(rows):
        seq = Sequence(("profile", i), [0] * per, SamplingParams())
        seq.block_table = list(range(i * -(-per // block_size), (i + 1) * -(-per // block_size)))
        seqs.append((seq, per))
    logits, _ = runner.run(seqs, [True] * rows)
    params = [SamplingParams(temperature=1.0, top_p=0.9, top_k=50, seed=0)] * rows
    sample(logits, params, [0.5] * rows)
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device) - before
    del cache, runner, logits
    torch.cuda.empty_cache()
    log.info("[kv-cache] a step of %d tokens and %d sampled rows takes %.2f GiB beyond the weights", tokens, rows,
             peak / 2**30)
    return peak


def size_on_gpu(model, kv_dtype, ops, tokens: int, rows: int, block_size: int,
                utilization: float, share: int = 1, graph_bytes: int = 0) -> tuple[int, str]:
    """`gpu_kv_cache_bytes` from the device's own figures and a profiled step; the decode
    graphs to be captured keep `graph_bytes` more (their logits), counted with the step."""
    import torch

    device = model.embed.weight.device
    peak = profile_step(model, kv_dtype, ops, tokens, rows, block_size)
    free, total = torch.cuda.mem_get_info(device)
    size, why = gpu_kv_cache_bytes(total, free, peak + graph_bytes, utilization, share,
                                   torch.cuda.memory_reserved(device))
    if graph_bytes:
        why += f" (of which {graph_bytes / 2**30:.2f} GiB the decode graphs' logits)"
    return size, f"auto: {why} (--gpu-memory-utilization)"
