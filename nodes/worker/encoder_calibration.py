"""Calibrating the encoder's terms of the cost model on this worker's device.

A micro-batch of b texts padded to L tokens is timed over a grid of (b, L) up to the
encoder's token budget (2,048 tokens on a CPU, 16,384 on a GPU: `grid`), on token ids
of its own (random ids from the encoder's vocabulary, never a job's texts), and
`t = a + c·b·L` is fitted by least squares. The fit is cached per (encoder
fingerprint, dtype, device, budget) like the decoder's calibration, and published with
the worker's membership, budget included, so a client can predict a job before it runs.
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
from shoal.nodes.worker.calibration import device_name
from shoal.scheduler.least_squares import fit_polynomial
from shoal.scheduler.superbatch import DEFAULT_TOKEN_BUDGET

log = logging.getLogger(__name__)

VERSION = 2


def grid(token_budget: int) -> list[tuple[int, int]]:
    """(texts, padded length) of the timed micro-batches: up to the budget. Past the CPU's
    budget, batches of 16 to 128 texts: a GPU's time is flat at first, and the fit has to
    see where it starts to grow."""
    counts = (1, 8, 32) if token_budget <= DEFAULT_TOKEN_BUDGET else (1, 16, 64, 128)
    return [(b, n) for n in (16, 48, 128) for b in counts if b * n <= token_budget]


def cache_path(encoder, root: Path | None = None) -> Path:
    dtype = str(encoder.w["embeddings.word_embeddings.weight"].dtype).removeprefix("torch.")
    budget = "" if encoder.token_budget == DEFAULT_TOKEN_BUDGET else f"-b{encoder.token_budget}"
    key = f"encoder-{encoder.fingerprint}-{dtype}-{device_name(str(encoder.device))}{budget}-v{VERSION}"
    safe = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in key)
    return (root or state_dir()) / "calibration" / f"{safe}.json"


def calibrate(encoder, repeats: int = 3, seed: int = 0) -> dict:
    """{"a": s per micro-batch, "c": s per padded token, "r2"} on this device."""
    vocab = encoder.w["embeddings.word_embeddings.weight"].shape[0]
    r = random.Random(seed)
    xs, ys = [], []
    encoder.encode_ids([[r.randrange(1000, vocab) for _ in range(32)]] * 4)  # warm up
    for b, n in grid(encoder.token_budget):
        batch = [[r.randrange(1000, vocab) for _ in range(n)] for _ in range(b)]
        times = []
        for _ in range(repeats):
            t = time.perf_counter()
            encoder.encode_ids(batch)
            times.append(time.perf_counter() - t)
        xs.append(b * n)
        ys.append(statistics.median(times))
    (a, c), r2 = fit_polynomial(xs, ys, 1)
    return {"a": max(a, 0.0), "c": c, "r2": r2, "device": device_name(str(encoder.device)),
            "threads": torch.get_num_threads(), "token_budget": encoder.token_budget}


def load_or_calibrate(encoder, root: Path | None = None) -> dict:
    path = cache_path(encoder, root)
    if path.exists():
        try:
            return {**json.loads(path.read_text()), "token_budget": encoder.token_budget}  # (a cache from before it was kept)
        except ValueError:
            log.warning("[calibrate] encoder calibration cache %s is unreadable; measuring again", path)
    t = time.perf_counter()
    cal = calibrate(encoder)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(cal))
    tmp.replace(path)
    log.info("[calibrate] encoder: a %.2e s per micro-batch, c %.2e s per padded token (R² %.3f) in %.1fs; cached in %s",
             cal["a"], cal["c"], cal["r2"], time.perf_counter() - t, path)
    return cal
