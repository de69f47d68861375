"""Injected failures of a worker's model runs, for fault tests (`SHOAL_FAULTS` step_error):
what a GPU host meets and a CPU test cannot make happen by itself.

    {"error": "cuda", "after_steps": 6}   every run from the 7th on: the device is lost
    {"error": "oom", "above_rows": 3}     runs of more than 3 sequences: out of memory
    {"error": "bug", "item": "x3"}        runs that hold item x3's sequence: a bug it triggers
"""

from __future__ import annotations

import torch

ERRORS = {
    "cuda": lambda: RuntimeError("CUDA error: an illegal memory access was encountered (injected)"),
    "oom": lambda: torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (injected)"),
    "bug": lambda: ValueError("injected bug"),
}


def inject_step_errors(engine, spec: dict) -> None:
    """Wraps the engine's model runs so that those `spec` names raise its error."""
    make = ERRORS.get(spec.get("error"))
    if make is None:
        raise ValueError(f"SHOAL_FAULTS step_error: 'error' must be one of {sorted(ERRORS)}, got {spec.get('error')!r}")
    after, above, item = spec.get("after_steps", 0), spec.get("above_rows"), spec.get("item")
    run, runs = engine.runner.run, [0]

    def failing(chunks, sample_mask, carry=None):
        runs[0] += 1
        if (runs[0] > after and (above is None or len(chunks) > above)
                and (item is None or any(seq.key_id == item for seq, _ in chunks))):
            raise make()
        return run(chunks, sample_mask, carry)

    engine.runner.run = failing
