"""Everything the engine resolves once, at start, in this order: the device, the compute
and KV cache dtypes (which depend on the device), the model on the device, the ops
backend, the KV cache's size, the cache itself, and on a GPU the decode graphs.

Each choice is logged with its reason and kept in `EngineSetup`, which the engine and
`shoal nodes` read; the step scheduler (`engine.py`: queues, KV blocks, preemption)
knows none of it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from shoal.nodes.worker.block_manager import BlockManager
from shoal.nodes.worker.decode_graphs import graph_output_bytes, graphs_unsupported
from shoal.nodes.worker.device_choice import DeviceChoice, choose_device, device_label
from shoal.nodes.worker.dtype_choice import DtypeChoice, choose_dtype, choose_kv_cache_dtype
from shoal.nodes.worker.engine_config import DEFAULT_BUDGET, EngineConfig
from shoal.nodes.worker.kv_cache import KVCache, bytes_per_token
from shoal.nodes.worker.kv_cache_size import PREFAULT_BYTES, choose_kv_cache_bytes
from shoal.nodes.worker.models.loader import load_decoder, parse_dtype
from shoal.nodes.worker.ops_backend import choose_ops

log = logging.getLogger(__name__)

# The largest step a GPU's KV sizing leaves room for when the budget is not set: the
# calibration's largest budget probe (`calibration.PROBE_BUDGETS`).
PROFILE_TOKENS = 4096


@dataclass
class EngineSetup:
    config: EngineConfig  # with the dtypes resolved and a step budget (the default until calibrated)
    device: DeviceChoice
    device_label: str  # the CPU's or GPU's model, for logs and the calibration's key
    dtype_choice: DtypeChoice
    kv_dtype_choice: DtypeChoice
    model: torch.nn.Module
    fingerprint: str
    streamer: object  # `WeightStreamer` when the device cannot hold every layer, else None
    packed_linears: int
    ops: object  # the ops backend, or None for the reference forward
    ops_reason: str
    cache: KVCache
    blocks: BlockManager
    kv_cache_reason: str
    graphs: object  # `DecodeGraphs` for decode steps, or None (eager)
    graphs_reason: str
    auto_budget: bool  # the budget is the default, for the calibration to replace
    budget_reason: str
    # On a GPU, the largest step (tokens, sampled rows) its memory was sized for: steps
    # sized later (weight streaming's) stay within it. None on a CPU.
    largest_step: tuple[int, int] | None = None


DEFAULT_MAX_SEQS, LARGE_GPU_MAX_SEQS = 256, 1024
LARGE_GPU_BYTES = 70 * 2**30


def default_max_seqs(device, total_bytes: int | None = None, share: int = 1) -> tuple[int, str]:
    """Sequences a step may hold when none is set, and why: more on a GPU with the memory
    for their KV (`total_bytes`: the device's, read from it when not given; `share`: the
    workers it is split among, each counting its part)."""
    if not device.is_gpu:
        return DEFAULT_MAX_SEQS, "the default"
    if total_bytes is None:
        total_bytes = torch.cuda.get_device_properties(torch.device(device.name)).total_memory
    what = f"a GPU of {total_bytes / 2**30:.0f} GiB" + (f" shared by {share} workers" if share > 1 else "")
    if total_bytes / max(1, share) >= LARGE_GPU_BYTES:
        return LARGE_GPU_MAX_SEQS, f"{what} (70 GiB or more each)"
    return DEFAULT_MAX_SEQS, f"{what} (under 70 GiB each)"


def set_up(model_dir: str | Path, config: EngineConfig) -> EngineSetup:
    device = choose_device(config.device)
    label = device_label(device.name)
    log.info("[device] %s, %s: %s", device.name, label, device.reason)
    if device.is_gpu:
        # What names no device (current streams, events, graph capture, Triton's launches)
        # takes this thread's current one: on `cuda:1` it must be cuda:1, not cuda:0.
        torch.cuda.set_device(torch.device(device.name))
    dtype_choice = choose_dtype(config.dtype, model_dir, on_gpu=device.is_gpu)
    if config.dtype == "auto":
        log.info("[dtype] %s: %s", dtype_choice.name, dtype_choice.reason)
    kv_dtype_choice = choose_kv_cache_dtype(config.kv_cache_dtype, config.dtype, dtype_choice, model_dir)
    auto_budget = config.max_num_batched_tokens is None
    max_seqs, seqs_reason = ((config.max_num_seqs, "as set") if config.max_num_seqs is not None
                             else default_max_seqs(device, share=config.gpu_share))
    log.info("[engine] up to %d sequences a step: %s", max_seqs, seqs_reason)
    # Calibration and stats name what runs; the budget is the default until a calibration says otherwise.
    config = replace(config, device=device.name, dtype=dtype_choice.name, kv_cache_dtype=kv_dtype_choice.name,
                     max_num_batched_tokens=DEFAULT_BUDGET if auto_budget else config.max_num_batched_tokens,
                     max_num_seqs=max_seqs)
    # A GPU that is to hold only part of the model gets it from the host: the streamer
    # keeps the streamed layers there (pinned) and moves the rest.
    load_to = "cpu" if config.device_memory and device.is_gpu else device.name
    model, fingerprint = load_decoder(model_dir, config.dtype, load_to)
    streamer = None
    if config.device_memory:
        from shoal.nodes.worker.weight_streamer import WeightStreamer, nbytes

        if nbytes(model) > config.device_memory:
            streamer = model.streamer = WeightStreamer(model, config.device_memory, device=device.name)
        elif load_to != device.name:
            model.to(device.name)
            model.rope.to(device.name)  # (plain tensors: Module.to leaves them)
    packed = 0
    if config.packed_linears and not device.is_gpu:  # oneDNN's blocked layout is a CPU layout
        from shoal.nodes.worker.models.packed_linear import pack_linears
        from shoal.nodes.worker.models.row_buckets import rows_pad_free

        padded = config.pad_rows if config.pad_rows is not None else rows_pad_free(config.dtype)
        packed = pack_linears(model, skip=tuple(model.layers[i] for i in streamer.streamed) if streamer else (),
                              rows_padded=padded)
    ops, ops_reason = choose_ops(config.attention, torch.device(device.name), model.cfg.head_dim)
    log.info("[attention] %s: %s", ops.name if ops is not None else "sdpa", ops_reason)
    kv_dtype = parse_dtype(config.kv_cache_dtype)
    step = largest_step(config, streamer is not None) if device.is_gpu else None
    no_graphs = "enforce_eager" if config.enforce_eager else graphs_unsupported(model, ops, torch.device(device.name))
    graph_bytes = 0 if no_graphs else graph_output_bytes(model, config.max_num_seqs)
    num_blocks, kv_reason = kv_cache_blocks(model, config, kv_dtype, ops, device, step, graph_bytes)
    blocks = BlockManager(num_blocks, config.block_size)
    # Decode graphs pad their batches with rows that write a scratch block no sequence owns.
    cache = KVCache(model.cfg, num_blocks + (0 if no_graphs else 1), config.block_size, kv_dtype,
                    prefault_bytes=PREFAULT_BYTES if config.kv_prefault else 0, device=device.name)
    log.info("[kv-cache] %.2f GiB, %d blocks of %d tokens: %s", cache.nbytes / 2**30, num_blocks, config.block_size,
             kv_reason)
    log.info("[kv-cache] %s: %s", config.kv_cache_dtype, kv_dtype_choice.reason)
    graphs, graphs_reason = None, f"eager: {no_graphs}" if no_graphs else ""
    if not no_graphs:
        graphs, graphs_reason = capture_graphs(model, cache, ops, config, num_blocks)
    return EngineSetup(config, device, label, dtype_choice, kv_dtype_choice, model, fingerprint, streamer, packed,
                       ops, ops_reason, cache, blocks, kv_reason, graphs, graphs_reason, auto_budget,
                       "no device calibration: the default" if auto_budget else "set by the user", step)


def largest_step(config: EngineConfig, streamed: bool) -> tuple[int, int]:
    """(tokens, sampled rows) of the largest step a GPU leaves room for: the budget (at
    least the calibration's largest probe) and max_num_seqs; with streamed weights, decode
    steps of as many sequences as that budget has tokens, so that steps sized to cover the
    weights' copy (`step_sizing.size_for_fetches`) have room."""
    tokens = max(PROFILE_TOKENS, config.max_num_batched_tokens)
    return tokens, max(config.max_num_seqs, tokens if streamed else 0)


def capture_graphs(model, cache, ops, config: EngineConfig, num_blocks: int):
    """Decode graphs for up to max_num_seqs sequences, or None where the capture fails
    (the engine then runs eager, and says why)."""
    from shoal.nodes.worker.decode_graphs import DecodeGraphs

    longest = min(model.cfg.max_position_embeddings, num_blocks * config.block_size)
    try:
        graphs = DecodeGraphs(model, cache, ops, config.max_num_seqs, -(-longest // config.block_size), num_blocks)
        graphs.capture()
    except Exception as e:  # a capture refused by this torch or driver: eager still computes the same
        log.warning("[graphs] capturing decode graphs failed (%s: %s); decode steps run eager", type(e).__name__, e)
        return None, f"eager: the capture failed ({type(e).__name__}: {e})"
    return graphs, f"CUDA graphs for decode steps of up to {graphs.sizes[-1]} sequences ({len(graphs.sizes)} sizes)"


def kv_cache_blocks(model, config: EngineConfig, kv_dtype: torch.dtype, ops, device: DeviceChoice,
                    step: tuple[int, int] | None = None, graph_bytes: int = 0) -> tuple[int, str]:
    """How many blocks the cache has, and why: `num_blocks` as set, else `kv_cache_bytes`
    as set, else on a GPU what its memory leaves after a profiled step of `step` (tokens,
    sampled rows; `gpu_memory.py`) and the decode graphs' `graph_bytes`, and on a CPU a share of the host's
    (`kv_cache_size.py`); never more than max_num_seqs full contexts can use (a tiny
    model does not get, and zero, gigabytes of cache it cannot fill)."""
    if config.num_blocks:
        return config.num_blocks, "num_blocks as set"
    useful = config.max_num_seqs * model.cfg.max_position_embeddings // config.block_size + 1
    if device.is_gpu and config.kv_cache_bytes is None:
        from shoal.nodes.worker.gpu_memory import size_on_gpu

        tokens, rows = step or largest_step(config, False)
        kv_bytes, reason = size_on_gpu(model, kv_dtype, ops, tokens, rows, config.block_size,
                                       config.gpu_memory_utilization, config.gpu_share, graph_bytes)
    else:
        kv_bytes, reason = choose_kv_cache_bytes(config.kv_cache_bytes, config.kv_cache_share)
    fits = kv_bytes // (bytes_per_token(model.cfg, kv_dtype) * config.block_size)
    if useful < fits:
        reason += f"; capped at what {config.max_num_seqs} full contexts can use"
    return max(1, min(useful, fits)), reason
