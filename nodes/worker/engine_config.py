"""The engine's settings, what a finished sequence returns, and the engine's counters."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from shoal.nodes.worker.kv_cache_size import DEFAULT_SHARE


@dataclass(frozen=True)
class EngineConfig:
    # "auto": a GPU where torch sees one, else the CPU; "cpu", "cuda" or "cuda:N"
    # (`device_choice.py`). The engine's own config names the device it chose.
    device: str = "auto"
    # "auto": the checkpoint's dtype where the device computes it natively, else float32
    # (`dtype_choice.py`); the engine's own config names the dtype it chose.
    dtype: str = "auto"
    block_size: int = 16
    # Default: as many as kv_cache_bytes holds, and no more than max_num_seqs full contexts use.
    num_blocks: int | None = None
    # The KV cache (also the prefix cache that keeps a sequence's context for its next
    # hop). None: kv_cache_share of the memory available once the model has loaded
    # (`kv_cache_size.py`; a local cluster gives each of its N workers 1/N of the default
    # share, and so does a cluster file to the workers of a host).
    kv_cache_bytes: int | None = None
    kv_cache_share: float = DEFAULT_SHARE
    # On a GPU, without kv_cache_bytes: the share of the device's memory the worker may
    # fill, the cache taking what the weights and a profiled step leave (`gpu_memory.py`).
    gpu_memory_utilization: float = 0.9
    # Workers given this same GPU (a host with more workers than GPUs): each fills
    # gpu_memory_utilization / gpu_share of it. Set by whoever starts the workers
    # (`SHOAL_GPU_SHARE`, `shoal/cluster/gpu_assignment.py`).
    gpu_share: int = 1
    # "auto": the compute dtype, or bf16 where `dtype="auto"` computes a bf16 checkpoint in
    # fp32 (decode attention reads half the bytes; `dtype_choice.choose_kv_cache_dtype`).
    kv_cache_dtype: str = "auto"
    # Commit the cache's first 4 GiB at start (one write over them), as vLLM does by zeroing
    # its cache: otherwise prefill steps pay for each fresh page's first write, which on
    # the VMs measured cost 1.2-2.3 s per GiB (15% of a W3-shaped prefill). Never-used
    # blocks are handed out lowest first, so a job stays in committed memory until it has
    # written 4 GiB of KV in all; beyond, memory is committed as blocks are first written.
    # False: all of it so (an idle cache costs nothing). The default follows
    # SHOAL_KV_PREFAULT (0: off), which the test suite sets for its many engines.
    kv_prefault: bool = field(default_factory=lambda: os.environ.get("SHOAL_KV_PREFAULT", "1") != "0")
    # Tokens per step. None: the device calibration's budget (the largest whose prefill
    # throughput is within 90% of the best probed; `CostModel.step_budget`), or
    # DEFAULT_BUDGET where there is no calibration. `budget_reason` says which.
    max_num_batched_tokens: int | None = None
    # Sequences a step may hold. None: 1,024 on a GPU of 70 GiB or more (an H100's
    # decode is bound by memory traffic well past 256 rows, and a wider step reads the
    # weights once for more tokens; vLLM's offline default for that class), else 256.
    max_num_seqs: int | None = None
    chunked_prefill: bool = True
    prefix_caching: bool = True
    # Host memory for the KV of sequences preempted when blocks run out: restored by a
    # copy instead of a prefill (on a GPU it would be pinned memory). 0: they recompute.
    offload_bytes: int = 0
    num_threads: int | None = None
    # The ops backend (`ops_backend.py`). "auto": "native" on a CPU, "triton" on a GPU
    # ("torch" where Triton is missing). "native": the compiled CPU ops (`kernels/`: paged
    # attention for every chunk and the fused norm / RoPE / activation), falling back to
    # "sdpa" if they cannot be built; "triton": the Triton paged attention kernel; "torch":
    # every op in torch on any device; "sdpa": the reference forward (gather the slots,
    # then scaled_dot_product_attention), which tests compare every backend with.
    attention: str = "auto"
    # Native attention only: a prefill chunk whose rows x context reach this many goes
    # through gather + scaled_dot_product_attention instead of the kernel's tiles
    # (`model_runner.py`); 0: never, the default (the tiles lead on every shape measured).
    sdpa_prefill_work: int = 0
    # Reorder every projection's weight once into oneDNN's blocked layout (CPU fp32/bf16;
    # `models/packed_linear.py`). False: plain nn.Linear, for A/B measurement.
    packed_linears: bool = True
    # Native forward: compute each step's tokens at one of a few row counts, padding the
    # rest (`models/row_buckets.py`): oneDNN then compiles a kernel per size, not per
    # step. None: where it is free (packed bf16 linears on a CPU with AMX).
    pad_rows: bool | None = None
    # On a GPU, decode steps replay CUDA graphs captured per padded batch size
    # (`decode_graphs.py`); True: every step runs eagerly.
    enforce_eager: bool = False
    # Launch each step before reading the last one's sampled tokens, so the host's work
    # runs while the device computes (`pending_tokens.py`). None: on a GPU.
    async_scheduling: bool | None = None
    # Bytes of weights the device may hold (0: all of them). Less streams the layers that
    # do not fit from host memory (`weight_streamer.py`).
    device_memory: int = 0
    # Step planning: "mb", "eb" or "ebplus" (switches between them online). EB and EB+
    # need the device calibration: loaded from the state dir, or measured at start-up.
    policy: str = "ebplus"


@dataclass
class RequestOutput:
    seq_id: object
    token_ids: list[int]
    text: str
    finish_reason: str  # "stop" (an end token, a stop string, a grammar completed) | "length"
    num_prompt_tokens: int
    margins: list[float] = field(default_factory=list)
    draws: list[list] = field(default_factory=list)  # [u, lo, hi, cut] of each sampled token
    # When asked for: per token {"token", "token_id", "logprob", "bytes", "top_logprobs": [...]}.
    logprobs: list[dict] | None = None


@dataclass
class EngineStats:
    steps: int = 0
    prompt_tokens_computed: int = 0
    prompt_tokens_cached: int = 0
    generated_tokens: int = 0
    preemptions: int = 0
    offloads: int = 0  # preempted sequences whose KV went to host memory
    restores: int = 0  # ... and came back from it
    time_plan: float = 0.0
    time_model: float = 0.0
    time_sample: float = 0.0
    time_grammar_wait: float = 0.0  # steps waiting for grammar masks after their forward pass
    steps_ahead: int = 0  # launched before the last step's tokens were read (async scheduling)
    rows_stepped: int = 0  # sequences summed over steps: / steps = the mean running batch
    # time_model split between prompt tokens and decoding rows of each step, in
    # proportion to their cost under the calibration (1:1 per token without one).
    time_prefill: float = 0.0
    time_decode: float = 0.0


DEFAULT_BUDGET = 512  # tokens per step when neither the user nor a calibration says
