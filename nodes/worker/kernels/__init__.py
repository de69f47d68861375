"""Native kernels, compiled on first use for this machine and cached by torch.

`paged_decode_attention` reads keys and values straight through block tables (the CPU
counterpart of a GPU paged-attention kernel). Building it takes about a minute the first
time on 2 cores; later processes load the cached build. If the build fails, the engine
falls back to gather + scaled_dot_product_attention and says so.
"""

from __future__ import annotations

import functools
import logging
from pathlib import Path

log = logging.getLogger(__name__)

_SRC = Path(__file__).with_name("paged_decode_attention.cpp")


@functools.cache
def paged_decode_attention():
    """The compiled op, or None when it cannot be built here."""
    try:
        from torch.utils.cpp_extension import load

        ext = load(
            name="shoal_paged_decode_attention_v2",
            sources=[str(_SRC)],
            extra_cflags=["-O3", "-march=native", "-ffast-math", "-fopenmp"],
            extra_ldflags=["-fopenmp"],
            verbose=False,
        )
        return ext.paged_decode_attention
    except Exception as e:  # a missing compiler or headers: the portable path still works
        log.warning("[kernels] paged decode attention unavailable (%s); using gather + SDPA", e)
        return None
