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


def worst_case_step(runner, rows: int, per: int):
    """Runs one step of `rows` sequences of `per` prompt tokens each (blocks 0.. of the
    runner's cache in order), each sampling once and asking for everything sampling can do
    at once (a grammar's mask, logprobs with the most alternatives, logit bias,
    min_tokens, all three penalties, margins and draws), through the engine's own
    sampling launch. Returns the tokens in flight, read. Any device: the CPU tests run it."""
    import numpy as np
    import torch

    from shoal.nodes.worker import logits_processing as lp
    from shoal.nodes.worker.sampling_launch import launch_sampling
    from shoal.nodes.worker.sequence import Sequence
    from shoal.sampling import MAX_LOGPROBS, SamplingParams

    params = SamplingParams(max_tokens=2, min_tokens=1, temperature=1.0, top_p=0.9, top_k=50, seed=0,
                            stop_token_ids=(0,), logit_bias=((0, 1.0),), presence_penalty=0.5, frequency_penalty=0.5,
                            repetition_penalty=1.1, logprobs=MAX_LOGPROBS, return_margins=True)
    per_seq = -(-per // runner.cache.block_size)
    seqs = []
    for i in range(rows):
        seq = Sequence(("profile", i), [0] * per, params)
        seq.block_table = list(range(i * per_seq, (i + 1) * per_seq))
        seqs.append(seq)
    with torch.inference_mode():  # as the engine steps: the logits are edited in place
        logits, _ = runner.run([(seq, per) for seq in seqs], [True] * rows)
        vocab = logits.shape[1]
        lp.apply_bitmask(logits, list(range(rows)), np.full((rows, -(-vocab // 32)), -1, dtype=np.int32))
        ops = runner.ops
        pending = launch_sampling(seqs, logits, ops.row_top2 if ops is not None else None,
                                  lambda p: list(p.stop_token_ids))
        pending.read()
    return pending


def profile_step(model, kv_dtype, ops, tokens: int, rows: int, block_size: int) -> int:
    """Bytes a step of `tokens` prompt tokens with `rows` sampled rows allocates beyond
    what the device holds before it (its activations, logits and its sampling's
    temporaries): `worst_case_step`'s peak on a small cache of its own, so a job that
    asks for all of sampling's figures at once fits what the sizing left."""
    import torch

    from shoal.nodes.worker.kv_cache import KVCache
    from shoal.nodes.worker.model_runner import ModelRunner

    device = model.embed.weight.device
    rows = max(1, min(rows, tokens))
    per = -(-tokens // rows)  # `rows` sequences sharing the step's tokens, each sampling once
    cache = KVCache(model.cfg, rows * -(-per // block_size), block_size, kv_dtype, device=device)
    runner = ModelRunner(model, cache, ops)
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)  # after its own small cache: that is not a step's
    worst_case_step(runner, rows, per)
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device) - before
    del cache, runner
    torch.cuda.empty_cache()
    log.info("[kv-cache] a step of %d tokens and %d sampled rows, asking for every figure, takes %.2f GiB "
             "beyond the weights", tokens, rows, peak / 2**30)
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
