"""Calibrating the step cost model on this worker's own device (EB+'s calibrated cost model).

Times pure prefill steps over a grid of lengths and pure decode steps over a grid of
batch sizes on the loaded engine, fits α_p, β_p, α_d, β_d by least squares, and fits
β_MB(r) = a + b·r + c·r² to the cost per token of short MB runs at several decode
shares r. A last probe times steps filled with many short prompts at growing token
budgets, from which the engine picks its default step budget (`CostModel.step_budget`).
The result is cached per (model fingerprint, dtype, device) as JSON; a cache for
another model, or a fit that fails validation, is refused with the reason.
"""

from __future__ import annotations

import json
import logging
import random
import statistics
import time
from pathlib import Path

import torch

from shoal.env import state_dir
from shoal.nodes.worker.dtype_choice import cpu_model
from shoal.sampling import SamplingParams
from shoal.scheduler.cost_model import R2_FLOOR, CalibrationError, CostModel
from shoal.scheduler.least_squares import fit_line_nonnegative, fit_measured, fit_polynomial
from shoal.scheduler.step_planner import MixedBatchPlanner, PlannerConfig

log = logging.getLogger(__name__)

CALIBRATION_VERSION = 5  # 2: the native engine (fused ops, paged prefill) and the budget probe; 3: α_d >= 0;
# 4: a fit below the floor is measured again; 5: large step tensors no longer page-fault (step_buffers.py)


def device_name(device: str = "cpu", backend: str = "") -> str:
    """What step costs depend on. A GPU: its model and memory, and the ops backend. A CPU:
    its model, the vector ISA its code runs at and the threads (ATEN_CPU_CAPABILITY or
    SHOAL_VECTOR_ISA can cap a CPU below its widest ISA)."""
    if device.startswith("cuda"):
        from shoal.nodes.worker.device_choice import device_label

        return f"cuda:{device_label(device)}:{backend}"
    from shoal.nodes.worker.kernels import default_isa

    isa, kernels = torch.backends.cpu.get_cpu_capability(), default_isa()
    if kernels != isa:
        isa += f"+kernels-{kernels}"
    return f"cpu:{cpu_model()}:{isa}:{torch.get_num_threads()}t"


def engine_device(engine) -> str:
    """`device_name` of the device and backend the engine runs on."""
    ops = engine.runner.ops
    return device_name(str(engine.config.device), ops.name if ops is not None else "sdpa")


def cache_path(engine, root: Path | None = None) -> Path:
    # Streamed weights make every step pay their copy: another device, as far as step costs go.
    streamed = f"-resident{engine.streamer.resident_bytes}" if getattr(engine, "streamer", None) else ""
    # A cache in another dtype than the model's changes what decode attention costs.
    dtype, kv = engine.config.dtype, engine.config.kv_cache_dtype
    dtypes = dtype if kv == dtype else f"{dtype}-kv{kv}"
    key = f"{engine.fingerprint.replace(':', '_')}-{dtypes}-{engine_device(engine)}{streamed}-v{CALIBRATION_VERSION}"
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in key)
    return (root or state_dir()) / "calibration" / f"{safe}.json"


def load_cached(engine, root: Path | None = None) -> CostModel | None:
    path = cache_path(engine, root)
    if not path.exists():
        return None
    try:
        cm = CostModel.from_dict(json.loads(path.read_text()))
    except (ValueError, CalibrationError) as e:
        raise CalibrationError(f"calibration cache {path} is unreadable: {e}") from None
    # Identity only: a poor fit is still this device's measurement, kept so the engine
    # decides the same way each start (the planner validates its quality).
    for what, want, have in (("model", engine.fingerprint, cm.model), ("dtype", engine.config.dtype, cm.dtype),
                             ("device", engine_device(engine), cm.device)):
        if want != have:
            raise CalibrationError(f"calibration cache {path} was measured for {what} {have!r}, not {want!r}")
    return cm


def save(engine, cm: CostModel, root: Path | None = None) -> Path:
    path = cache_path(engine, root)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(cm.to_dict(), indent=2))
    tmp.replace(path)
    return path


def _timed_steps(engine, count: int) -> list[float]:
    times = []
    for _ in range(count):
        t = time.perf_counter()
        engine.step()
        times.append(time.perf_counter() - t)
    return times


def _prompt(r: random.Random, engine, n: int) -> list[int]:
    return [r.randrange(engine.model_cfg.vocab_size - 1) for _ in range(n)]


# Grids where the linear step-time model holds. On a CPU: below ~16 sequences a decode
# step is bound by reading the weights and its time is flat, which bends a line fit. On a
# GPU a step of a few hundred tokens is bound by launches and weight reads, not compute:
# prefill is fitted where it computes (256-4,096 tokens), decode over the batches a GPU
# runs (up to 256), with contexts long enough that their KV reads count beside the weights.
CPU_GRIDS = dict(prefill_lengths=(64, 128, 256, 384, 512), decode_batches=(16, 32, 48, 64, 96, 128),
                 decode_context=128, mb_tokens=2048)
GPU_GRIDS = dict(prefill_lengths=(256, 512, 1024, 2048, 4096), decode_batches=(32, 64, 96, 128, 192, 256),
                 decode_context=256, mb_tokens=8192)


def calibrate(engine, prefill_lengths=None, decode_batches=None, decode_context=None,
              mb_shares=(0.2, 0.5, 0.8, 0.95), mb_tokens=None, repeats=4, progress=None) -> CostModel:
    """Measures this engine's model on this device (the grids not given: the device's,
    CPU_GRIDS or GPU_GRIDS). Each step is timed to its end, which on a GPU is the read
    of its sampled tokens: the device's time. The engine must be idle; it is left idle,
    with its own planner restored."""
    if engine.has_unfinished():
        raise RuntimeError("calibrate needs an idle engine")
    grids = GPU_GRIDS if str(engine.config.device).startswith("cuda") else CPU_GRIDS
    prefill_lengths = prefill_lengths or grids["prefill_lengths"]
    decode_batches = decode_batches or grids["decode_batches"]
    decode_context = decode_context or grids["decode_context"]
    mb_tokens = mb_tokens or grids["mb_tokens"]
    r = random.Random(1234)  # calibration texts of its own, never the job's
    # Keep every probe inside what this engine can hold.
    limit = min(engine.max_total_tokens, engine.model_cfg.max_position_embeddings) - 2
    prefill_lengths = [L for L in prefill_lengths if L <= limit] or [max(2, limit // 4), max(3, limit // 2)]
    # The batch's contexts must fit the whole KV cache together (not one sequence's limit).
    capacity = engine.blocks.num_blocks * engine.config.block_size
    decode_batches = [k for k in decode_batches if k <= engine.config.max_num_seqs
                      and k * (decode_context + repeats + 2 * engine.config.block_size) <= capacity] or [1, 2]
    decode_context = min(decode_context, limit // 2)
    saved = engine.planner
    max_len = max(prefill_lengths)
    cfg = PlannerConfig(block_size=engine.config.block_size, max_num_batched_tokens=max(max_len, max(decode_batches)),
                        max_num_seqs=max(max(decode_batches), 64), num_blocks=engine.blocks.num_blocks)
    engine.planner = MixedBatchPlanner(cfg)  # a budget that prefills each prompt in one step
    # Each step is timed to its own tokens' read, not to the last step's.
    overlapped, engine.async_scheduling = engine.async_scheduling, False
    say = progress or (lambda msg: log.info("[calibrate] %s", msg))
    try:
        def prefill(reps: int):
            xs, ys = [], []
            for L in prefill_lengths:
                samples = []
                for i in range(reps + 1):  # fresh prompts each time: no prefix cache hits
                    engine.add_request(("cal-p", L, reps, i), prompt_token_ids=_prompt(r, engine, L),
                                       params=SamplingParams(max_tokens=1, ignore_eos=True))
                    samples += _timed_steps(engine, 1)
                xs.append(L)
                ys.append(statistics.median(samples[1:]))  # the first run warms caches
            return xs, ys

        (ap, bp), r2p = fit_measured(prefill, fit_line_nonnegative, repeats, R2_FLOOR)
        say(f"prefill: α_p {ap * 1e3:.2f} ms, β_p {bp * 1e6:.1f} µs/token, R² {r2p:.3f}")

        def decode(reps: int):
            xs, ys = [], []
            for k in decode_batches:
                for i in range(k):
                    engine.add_request(("cal-d", k, reps, i), prompt_token_ids=_prompt(r, engine, decode_context),
                                       params=SamplingParams(max_tokens=reps + 64, ignore_eos=True))
                while any(s.num_computed < s.num_prompt_tokens for s in engine.seqs.values()):
                    engine.step()
                xs.append(k)
                ys.append(statistics.median(_timed_steps(engine, reps + 2)))
                for sid in list(engine.seqs):
                    engine.abort(sid)
            return xs, ys

        # A step's overhead is not negative: where noise (or attention growing with the
        # batch) tilts the free fit below zero, the best line with α_d >= 0 is taken, as
        # for prefill, instead of a calibration every policy must refuse.
        (ad, bd), r2d = fit_measured(decode, fit_line_nonnegative, repeats, R2_FLOOR)
        say(f"decode: α_d {ad * 1e3:.2f} ms, β_d {bd * 1e6:.1f} µs/sequence, R² {r2d:.3f}")

        engine.planner = MixedBatchPlanner(engine.planner_config())  # MB as the engine runs it
        def mixed(reps: int):  # one run per share: its many steps are the repeats
            xs, ys = [], []
            for share in mb_shares:
                total = 64  # tokens per sequence: prompt + output
                out_len = max(1, int(round(share * total)))
                n = max(2, mb_tokens // total)
                for i in range(n):
                    engine.add_request(("cal-m", share, reps, i), prompt_token_ids=_prompt(r, engine, max(1, total - out_len)),
                                       params=SamplingParams(max_tokens=out_len, ignore_eos=True))
                t = time.perf_counter()
                while engine.has_unfinished():
                    engine.step()
                xs.append(out_len / total)
                ys.append((time.perf_counter() - t) / (n * total))
            return xs, ys

        (a, b, c), r2m = fit_measured(mixed, lambda xs, ys: fit_polynomial(xs, ys, 2), repeats, R2_FLOOR)
        say(f"MB: β_MB(r) = {a * 1e6:.1f} + {b * 1e6:.1f}·r + {c * 1e6:.1f}·r² µs/token, R² {r2m:.3f}")
        probe = probe_budgets(engine, r, repeats)
        say("budget probe: " + ", ".join(f"{n} tokens {n / t:.0f} tok/s" for n, t in probe))
    finally:
        for sid in list(engine.seqs):
            engine.abort(sid)
        while engine.has_unfinished():  # (aborted: only tokens in flight are left to drop)
            engine.step()
        engine.planner, engine.async_scheduling = saved, overlapped
        engine.reset_stats()
    return CostModel(ap, bp, ad, bd, a, b, c, model=engine.fingerprint, dtype=engine.config.dtype,
                     device=engine_device(engine), r2={"prefill": r2p, "decode": r2d, "mb": r2m}, budget_probe=probe)


PROBE_BUDGETS = (128, 256, 512, 1024, 2048, 4096)
PROBE_PROMPT = 128  # tokens per prompt: a step's throughput, not one long prompt's attention


def probe_budgets(engine, r: random.Random, repeats: int) -> list[list[float]]:
    """[[tokens, seconds]] of single steps that prefill budget / 128 prompts of 128
    tokens, for each budget the KV cache and the sequence limit allow."""
    capacity = engine.blocks.num_blocks * engine.config.block_size
    points = []
    for budget in PROBE_BUDGETS:
        n = budget // PROBE_PROMPT
        if budget > capacity // 2 or n > engine.config.max_num_seqs:
            break
        engine.planner = MixedBatchPlanner(PlannerConfig(block_size=engine.config.block_size,
                                                         max_num_batched_tokens=budget, max_num_seqs=n,
                                                         num_blocks=engine.blocks.num_blocks))
        samples = []
        for i in range(repeats + 1):
            for j in range(n):
                engine.add_request(("cal-b", budget, i, j), prompt_token_ids=_prompt(r, engine, PROBE_PROMPT),
                                   params=SamplingParams(max_tokens=1, ignore_eos=True))
            samples += _timed_steps(engine, 1)
            while engine.has_unfinished():
                engine.step()
        points.append([budget, statistics.median(samples[1:])])
    return points
