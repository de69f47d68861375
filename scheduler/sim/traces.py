"""Workloads for the simulator: the paper's synthetic cells and non-stationary traces."""

from __future__ import annotations

from shoal.scheduler.sim.simulator import Request, synthetic_requests

# (mean prompt, mean output) of the paper's synthetic workloads, ±50% jitter.
CELLS = {"decode-heavy": (128, 1024), "balanced": (512, 512), "prefill-heavy": (1024, 128)}


def cell(name: str, requests: int, concurrency: int, seed: int = 0) -> list[tuple[list[Request], int]]:
    mp, mo = CELLS[name]
    return [(synthetic_requests(requests, mp, mo, seed=seed), concurrency)]


def distribution_shift(requests_per_phase: int, concurrency: int, seed: int = 0, scale: float = 1.0):
    """(1024,128) → (512,512) → (128,1024) at fixed concurrency."""
    return [(synthetic_requests(requests_per_phase, int(mp * scale), int(mo * scale), seed=seed + i), concurrency)
            for i, (mp, mo) in enumerate([(1024, 128), (512, 512), (128, 1024)])]


def concurrency_shift(requests_per_unit: float, levels=(32, 512, 1024, 256, 2048), mean_prompt: int = 512,
                      mean_output: int = 512, seed: int = 0, scale: float = 1.0):
    """Concurrency 32 → 512 → 1024 → 256 → 2048, each phase with requests ∝ its level."""
    return [(synthetic_requests(max(1, int(c * requests_per_unit)), int(mean_prompt * scale), int(mean_output * scale),
                                seed=seed + i), int(c * scale) if scale < 1 else c)
            for i, c in enumerate(levels)]
