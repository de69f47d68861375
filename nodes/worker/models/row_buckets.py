"""A step's row count rounded up to one of a few sizes, so that oneDNN builds each bf16
matrix multiply once per size instead of once per step.

oneDNN compiles a kernel the first time it sees a (rows, in, out) shape and keeps it in
its primitive cache. For a bf16 linear on AMX the compile costs more than the multiply:
W1's 768 x 4,096 projection took 2.6 ms on a new row count and 0.9 ms after. A
generation job steps at a different token count almost every step (the running
sequences, the prefill chunk), so a W1 job in a fresh process compiled ~1,500 kernels
(5-6 shapes a step): padded, it took 13.7-14.1 s against 14.2-14.3 s (three fresh
processes each, alternated; 2-core Xeon with AMX). Rounding up costs nothing there:
AMX multiplies tiles of 16 rows, so 113 rows took as long as 128 (and 200 rows of the
vocabulary projection longer than 208). Without AMX it is not free (AVX512_BF16 kernels
cost in proportion to the rows, and their compile is a quarter of a run, not more), so
the engine rounds only where the CPU has AMX (`engine.py`).

Sizes: multiples of 16 up to 256 rows (decode steps), then 16 sizes per doubling (at
most 1/16 more rows than asked): 96 sizes up to 8,192 rows, within oneDNN's default
cache of 1,024 kernels at the 5-6 shapes of a decoder's linears.
"""

from __future__ import annotations

import os

TILE_ROWS = 16  # an AMX tile's rows
SIZES_PER_DOUBLING = 16


def padded_rows(rows: int) -> int:
    """The size `rows` rows are computed at: the smallest listed size >= rows."""
    if rows <= 16 * TILE_ROWS:
        return -(-rows // TILE_ROWS) * TILE_ROWS
    step = (1 << (rows.bit_length() - 1)) // SIZES_PER_DOUBLING
    return -(-rows // step) * step


def rows_pad_free(dtype: str) -> bool:
    """Whether padding a step's rows costs nothing here: packed bf16 linears on a CPU
    whose oneDNN multiplies them in AMX tiles."""
    from shoal.nodes.worker.dtype_choice import cpu_flags

    cap = os.environ.get("ONEDNN_MAX_CPU_ISA", "ALL").upper()  # a cap below AMX leaves its kernels out
    return dtype == "bfloat16" and "amx_bf16" in cpu_flags() and (cap in ("ALL", "DEFAULT") or "AMX" in cap)
