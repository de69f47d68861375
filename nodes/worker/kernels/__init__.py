"""Native CPU ops, compiled on first use for this machine and cached by torch.

`paged_attention` reads keys and values straight through block tables, for decode
tokens and prefill chunks (the CPU counterpart of a GPU paged-attention kernel);
`rms_norm`, `qkv_rope_cache` and `silu_mul` fuse the elementwise work of a decoder
layer; `row_top2` makes a step's greedy picks and their margins in one pass. The
module is built with ATen's vector types for the widest instruction set this CPU has
(AVX-512 or AVX2), each under its own build name, so a cache shared by machines of
both kinds never hands one the other's binary. Building takes under a minute per build
the first time on 2 cores (only bindings.cpp includes torch/extension.h: parsing it
takes 23 s a file, the ATen headers the kernels include 3 s); later processes load the
cached build. If the build fails, the engine falls back to gather +
scaled_dot_product_attention and says so.

torch marks a build in progress with a `lock` file in its folder and makes every other
process wait while it exists; a process killed mid-build (a worker's first start,
kill -9) leaves it behind and every later one waits forever. So builds here hold an
flock of their own, which the kernel drops when its holder dies, and clear torch's file
under it: whoever holds the flock is the only builder.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import logging
import os
from pathlib import Path

log = logging.getLogger(__name__)

_HERE = Path(__file__).parent
_SOURCES = [str(_HERE / n) for n in ("paged_attention.cpp", "prefill_bf16.cpp", "prefill_amx.cpp", "decode_bf16.cpp",
                                     "fused_ops.cpp", "row_top2.cpp", "bindings.cpp")]


def _source_digest() -> str:
    """Names the build after its sources and header: torch's cache keys a build by its
    name and hashes only the .cpp files, so an edited header would keep a stale build."""
    h = hashlib.blake2b(digest_size=6)
    for path in sorted(_HERE.glob("*.cpp")) + sorted(_HERE.glob("*.h")):
        h.update(path.name.encode() + path.read_bytes())
    return h.hexdigest()


# The AVX-512 build's code on an AVX2 CPU, through SIMDe (avx512_emulation.h): for tests,
# which check the AVX-512 kernels wherever they run (tests/native_builds.py). default_isa()
# never picks it; `SHOAL_VECTOR_ISA` may name it.
EMULATED_AVX512 = "AVX512_EMULATED"


def emulation_available() -> bool:
    """Whether SIMDe's headers (Debian's libsimde-dev) are here for the emulated build."""
    return Path("/usr/include/simde/x86/avx512.h").exists()


def vector_isa(flags: set[str]) -> str:
    """The ATen CPU capability to build for: what the vector code compiles to."""
    if {"avx512f", "avx512bw", "avx512vl", "avx512dq"} <= flags:
        return "AVX512"
    if {"avx2", "fma"} <= flags:
        return "AVX2"
    return "DEFAULT"


def default_isa() -> str:
    """This CPU's widest build, or `SHOAL_VECTOR_ISA` (AVX512, AVX2 or DEFAULT) when set:
    to measure or test a narrower build on a wider CPU."""
    from shoal.nodes.worker.dtype_choice import cpu_flags

    return os.environ.get("SHOAL_VECTOR_ISA") or vector_isa(cpu_flags())


def build_name(isa: str) -> str:
    """torch's name for this source tree's build for `isa` (its cache folder's name)."""
    return f"shoal_native_ops_{_source_digest()}_{isa.lower()}"


@functools.cache
def native_ops(isa: str | None = None):
    """The compiled extension module for `isa` (default: `default_isa()`), or None when
    it cannot be built here."""
    try:
        from torch.utils.cpp_extension import load

        isa = isa or default_isa()
        if isa not in ("AVX512", "AVX2", "DEFAULT", EMULATED_AVX512):
            raise ValueError(f"unknown vector ISA {isa!r}; choose AVX512, AVX2, DEFAULT or {EMULATED_AVX512}")
        cflags = ["-O3", "-fopenmp", f"-DCPU_CAPABILITY={isa.split('_')[0]}"]
        if isa == "AVX512":
            cflags += ["-DCPU_CAPABILITY_AVX512", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mfma"]
        elif isa == EMULATED_AVX512:
            cflags += ["-DCPU_CAPABILITY_AVX512", "-mavx2", "-mfma", "-mf16c", "-include", str(_HERE / "avx512_emulation.h")]
        elif isa == "AVX2":
            cflags += ["-DCPU_CAPABILITY_AVX2", "-mavx2", "-mfma", "-mf16c"]
        name = build_name(isa)
        with _only_builder(name):
            ext = load(name=name, sources=_SOURCES, extra_cflags=cflags, extra_ldflags=["-fopenmp"], verbose=False)
        log.info("[kernels] native ops built for %s (%d floats per vector)", isa, ext.vector_width())
        return ext
    except Exception as e:  # a missing compiler or headers: the portable path still works
        log.warning("[kernels] native ops unavailable (%s); using the torch reference path (gather + SDPA)", e)
        return None


@contextlib.contextmanager
def _only_builder(name: str):
    """Holds an flock beside torch's build folder for `name`, and removes torch's `lock`
    file there: under the flock no other process is building, so the file is stale."""
    from torch.utils.cpp_extension import _get_build_directory

    folder = Path(_get_build_directory(name, verbose=False))
    with open(folder.parent / f"{name}.flock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        if (folder / "lock").exists():
            log.warning("[kernels] removing %s, left by a build that was killed", folder / "lock")
            (folder / "lock").unlink(missing_ok=True)
        yield
