"""A worker node's options: the command line (`shoal node worker --help`), the
`WorkerConfig` the node runs with, and loading the models the options name (on the
compute thread that will run them)."""

from __future__ import annotations

import argparse
import logging
import os
from dataclasses import dataclass

from shoal.nodes.worker.device_choice import DEVICE_HELP, GPU_SHARE_ENV, device_arg
from shoal.nodes.worker.dtype_choice import DTYPE_NAMES, KV_CACHE_DTYPE_NAMES
from shoal.nodes.worker.gpu_memory import check_utilization
from shoal.nodes.worker.kv_cache_size import DEFAULT_SHARE, check_share
from shoal.scheduler.superbatch import token_budget_arg


@dataclass(frozen=True)
class WorkerConfig:
    """What the worker node itself needs (the engine and encoder come built)."""
    storage: str = ""  # default storage node; an assignment may name its job's own
    stall_timeout: float = 300.0  # seconds without a step, while holding work, before it exits
    checkpoint_tokens: int = 256  # record a sequence's state every N generated tokens
    link_bytes_per_s: float = 1.25e9  # to other workers: ship a moving sequence's KV or drop it
    retrieve_timeout: float = 30.0  # seconds a Retrieve waits for every shard of its index
    retrieve_window_s: float = 0.002  # queries within this window share one search call per shard
    allowed_programs: tuple[str, ...] | None = None  # user programs it may import; None: any
    step_log: str = ""  # a file to append each step's end time and length to (a diagnostic)


def share_arg(text: str) -> float:
    """--kv-cache-share: refused when the worker starts, not once its model has loaded."""
    try:
        return check_share(float(text))
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def utilization_arg(text: str) -> float:
    """--gpu-memory-utilization: refused when the worker starts."""
    try:
        return check_utilization(float(text))
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def add_worker_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--model", help="a decoder model folder (a worker hosts a decoder, an encoder, or both)")
    ap.add_argument("--storage", default="", help="default storage node address (assignments may name one)")
    ap.add_argument("--dtype", default="auto", choices=list(DTYPE_NAMES),
                    help="compute dtype; auto: the checkpoint's where this device computes it natively, else float32")
    ap.add_argument("--device", type=device_arg, default="auto", help=f"the device the models compute on: {DEVICE_HELP}")
    ap.add_argument("--gpu-memory-utilization", type=utilization_arg, default=0.9,
                    help="on a GPU without --kv-cache-bytes: the share of the device's memory this worker may fill; "
                         "the KV cache takes what the weights and a profiled worst-case step leave")
    ap.add_argument("--attention", default="auto", choices=["auto", "native", "triton", "torch", "sdpa"],
                    help="the ops backend: auto (native on a CPU, triton on a GPU), or one by name")
    ap.add_argument("--enforce-eager", action="store_true",
                    help="on a GPU, run decode steps eagerly instead of replaying CUDA graphs")
    ap.add_argument("--no-async-scheduling", action="store_true",
                    help="on a GPU, read each step's tokens before planning the next (by default the next "
                         "step is launched first, so the host's work overlaps the device's)")
    ap.add_argument("--policy", default="ebplus", choices=["mb", "eb", "ebplus"])
    ap.add_argument("--threads", type=int, default=None, help="torch threads for the model")
    ap.add_argument("--budget", type=int, default=None,
                    help="max tokens per engine step (default: from the device calibration, else 512)")
    ap.add_argument("--encoder", help="a sentence-transformers folder: this worker runs Embed operations and "
                    "embedding jobs' SuperBatches with it")
    ap.add_argument("--encoder-dtype", default="auto", choices=list(DTYPE_NAMES),
                    help="the encoder's compute dtype (vectors are stored as the job asks)")
    ap.add_argument("--encoder-token-budget", type=token_budget_arg, default=None,
                    help="padded tokens per encoder micro-batch (default: 2048 on a CPU, 16384 on a GPU)")
    ap.add_argument("--kv-cache-bytes", type=int, default=None,
                    help="memory for the KV cache (its blocks also keep finished prompts for prefix reuse); default: "
                         "--kv-cache-share of the memory available once the model has loaded. Its first 4 GiB are "
                         "committed when the worker starts, the rest as blocks are first written "
                         "(SHOAL_KV_PREFAULT=0: all of it so)")
    ap.add_argument("--kv-cache-share", type=share_arg, default=DEFAULT_SHARE,
                    help="without --kv-cache-bytes, the share of the memory available at start that the KV cache takes "
                         "(a local cluster gives each of its N workers 1/N of the default)")
    ap.add_argument("--kv-cache-dtype", default="auto", choices=list(KV_CACHE_DTYPE_NAMES),
                    help="dtype the KV cache stores; auto: the compute dtype, or bfloat16 where --dtype auto computes a "
                         "bfloat16 checkpoint in float32 (half the bytes for decode attention to read)")
    ap.add_argument("--offload-bytes", type=int, default=2 << 30,
                    help="host memory for the KV of sequences preempted when KV blocks run out (restored by a copy, "
                         "not a prefill); 0: they recompute")
    ap.add_argument("--device-memory", type=int, default=0,
                    help="bytes of decoder weights the device may hold (0: all); layers beyond it stream from host "
                         "memory (a MoE layer's experts only when some token routes to them), and with a device "
                         "calibration the steps grow until their compute covers the copies")
    ap.add_argument("--link-bytes-per-s", type=float, default=1.25e9,
                    help="bandwidth to other workers, for the rule that ships a moving sequence's KV or drops it")
    ap.add_argument("--checkpoint-tokens", type=int, default=256,
                    help="record a sequence's state with storage every N generated tokens (and after every "
                         "operation), so that a dead worker's sequences restart from there; 0: between operations only")
    ap.add_argument("--retrieve-timeout", type=float, default=30.0,
                    help="seconds a Retrieve waits for every shard of its index to answer (failing over between "
                         "replicas) before its sequence fails with an error")
    ap.add_argument("--retrieve-window-ms", type=float, default=2.0,
                    help="queries arriving within this window share one search call per shard")
    ap.add_argument("--stall-timeout", type=float, default=300.0,
                    help="seconds without a step, while holding work, before the worker revokes its lease and exits")
    ap.add_argument("--allow-programs", action="append", default=None, metavar="PATTERN",
                    help="user programs (package.module:function) this worker may import, shell-style "
                         "(mypkg.*:*, or a module pattern); repeat for more. Built-ins always run. Default: "
                         "any on a loopback address, none beyond it")
    ap.add_argument("--step-log", default="", metavar="PATH",
                    help="append one line per engine step to PATH: the unix time it ended and its seconds "
                         "(to measure what else on the host slows the steps; scripts/bench_cluster.py --pause-others)")


def config_from_args(args: argparse.Namespace, open_by_default: bool) -> WorkerConfig:
    """`open_by_default`: the node listens on loopback, where any user program runs
    unless --allow-programs narrows it."""
    allowed = tuple(args.allow_programs or ()) if args.allow_programs is not None or not open_by_default else None
    return WorkerConfig(args.storage, args.stall_timeout, args.checkpoint_tokens, args.link_bytes_per_s,
                        args.retrieve_timeout, args.retrieve_window_ms / 1000, allowed, args.step_log)


def gpu_share() -> int:
    """How many workers were given this worker's GPU (`SHOAL_GPU_SHARE`, set beside
    `CUDA_VISIBLE_DEVICES` by `gpu_assignment.worker_gpu_env`); 1 when unset."""
    raw = os.environ.get(GPU_SHARE_ENV, "1")
    try:
        share = int(raw)
    except ValueError:
        raise ValueError(f"{GPU_SHARE_ENV}={raw!r}: expected a whole number of workers") from None
    return max(1, share)


def load_decoder(args):
    """The engine of `--model` (calibrated when its policy needs it), or a stand-in
    for an encoder-only worker."""
    if args.model:
        from shoal.nodes.worker.engine import EngineConfig, LLMEngine

        return LLMEngine(args.model, EngineConfig(dtype=args.dtype, policy=args.policy, num_threads=args.threads,
                                                  max_num_batched_tokens=args.budget, offload_bytes=args.offload_bytes,
                                                  kv_cache_bytes=args.kv_cache_bytes, kv_cache_share=args.kv_cache_share,
                                                  kv_cache_dtype=args.kv_cache_dtype, device_memory=args.device_memory,
                                                  device=args.device, attention=args.attention,
                                                  gpu_memory_utilization=args.gpu_memory_utilization,
                                                  gpu_share=gpu_share(),
                                                  enforce_eager=args.enforce_eager,
                                                  async_scheduling=False if args.no_async_scheduling else None))
    from shoal.nodes.worker.no_decoder import NoDecoder

    set_threads(args)
    return NoDecoder()


def set_threads(args) -> None:
    """torch's threads as the engine sets them (`--threads`, else the cores this process
    owns), for work on the compute thread before the engine exists: the encoder, loaded
    and calibrated first, is then timed with the threads it will run with."""
    import torch

    from shoal.nodes.worker.cpu_threads import cores_owned

    torch.set_num_threads(args.threads or cores_owned()[0])


def load_encoder(args):
    """The encoder of `--encoder` and its calibrated cost."""
    import torch

    from shoal.nodes.worker.device_choice import choose_device
    from shoal.nodes.worker.dtype_choice import choose_encoder_dtype
    from shoal.nodes.worker.encoder_calibration import load_or_calibrate
    from shoal.nodes.worker.models.encoder import Encoder

    set_threads(args)
    device = choose_device(args.device)
    choice = choose_encoder_dtype(args.encoder_dtype, args.encoder, on_gpu=device.is_gpu)
    logging.getLogger(__name__).info("[dtype] encoder %s on %s: %s", choice.name, device.name, choice.reason)
    encoder = Encoder(args.encoder, dtype=getattr(torch, choice.name), device=device.name,
                      token_budget=getattr(args, "encoder_token_budget", None))
    return encoder, load_or_calibrate(encoder)
