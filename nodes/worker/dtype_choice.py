"""Which dtype a worker computes in: `--dtype auto` (the default) takes the checkpoint's
`torch_dtype` where the device computes it natively, and fp32 where it does not.

On a CPU, bf16 matrix multiplies are fast only with AVX512_BF16 or AMX (about 2.5x fp32
on AVX-512 machines); with AVX2 alone they run at about a tenth of fp32, so a bf16
checkpoint is converted to fp32 once at load. fp16 has no fast CPU path and gets the
same treatment. On a GPU the checkpoint's dtype is used as it is.

The KV cache's dtype follows (`--kv-cache-dtype auto`): the compute dtype, except where
`auto` turned a bf16 checkpoint into fp32 compute. There the cache keeps bf16, the
checkpoint's dtype: decode attention reads every cached key and value each step and is
bound by memory (on a 2-core AVX2 EPYC at W1's shape, 57 ms a step from an fp32 cache,
40 ms from a bf16 one), and a cache of the same bytes holds twice the tokens. Queries,
scores and sums stay fp32 (on such a CPU the kernel's fp32 loops run); keys and values
are rounded once, as a bf16 run rounds them.
"""

from __future__ import annotations

import json
import platform
from dataclasses import dataclass
from pathlib import Path

DTYPE_NAMES = ("auto", "float32", "bfloat16")
KV_CACHE_DTYPE_NAMES = ("auto", "float32", "bfloat16")


@dataclass(frozen=True)
class DtypeChoice:
    name: str  # float32 | bfloat16 | float16: what the engine computes in
    reason: str


def cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    for line in text.splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo), or what the platform says."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cpu_native_bf16(flags: set[str] | None = None) -> str | None:
    """The CPU feature that makes bf16 matmuls fast here, or None."""
    flags = cpu_flags() if flags is None else flags
    for feature in ("amx_bf16", "avx512_bf16"):
        if feature in flags:
            return feature
    return None


def checkpoint_dtype(model_dir: str | Path) -> str:
    try:
        raw = json.loads((Path(model_dir) / "config.json").read_text())
    except (OSError, ValueError):
        return "float32"  # the loader reports a broken config with its own words
    return str(raw.get("torch_dtype") or raw.get("dtype") or "float32")


def choose_dtype(requested: str, model_dir: str | Path, on_gpu: bool = False, flags: set[str] | None = None) -> DtypeChoice:
    if requested != "auto":
        return DtypeChoice(requested, f"--dtype {requested}")
    ckpt = checkpoint_dtype(model_dir)
    if ckpt not in ("float32", "bfloat16", "float16"):
        return DtypeChoice("float32", f"checkpoint dtype {ckpt!r} is not one Shoal computes in: float32")
    if ckpt == "float32":
        return DtypeChoice("float32", "the checkpoint's dtype (float32)")
    if on_gpu:
        return DtypeChoice(ckpt, f"the checkpoint's dtype ({ckpt}) on a GPU")
    feature = cpu_native_bf16(flags)
    if ckpt == "bfloat16" and feature:
        return DtypeChoice("bfloat16", f"the checkpoint's dtype (bfloat16); this CPU has {feature}")
    why = ("this CPU has neither AVX512_BF16 nor AMX, where bf16 matmuls run at a fraction of fp32"
           if ckpt == "bfloat16" else "CPUs have no fast float16 matmuls")
    return DtypeChoice("float32", f"the checkpoint is {ckpt}, but {why}: computing in float32 "
                                  "(weights converted once at load)")


def choose_encoder_dtype(requested: str, folder: str | Path, on_gpu: bool = False) -> DtypeChoice:
    """An encoder's dtype: on a GPU `auto` is float16, as sentence-transformers users run
    encoders there (vectors within ~1e-3 in cosine of fp32's; `--encoder-dtype float32`
    keeps fp32); elsewhere as a decoder's."""
    if requested == "auto" and on_gpu:
        return DtypeChoice("float16", "auto on a GPU: encoders compute in float16 (--encoder-dtype float32 for fp32)")
    return choose_dtype(requested, folder, on_gpu=on_gpu)


def choose_kv_cache_dtype(requested: str, dtype_requested: str, compute: DtypeChoice, model_dir: str | Path) -> DtypeChoice:
    """The KV cache's dtype for a model computing in `compute.name`, which `--dtype
    dtype_requested` chose."""
    if requested != "auto":
        if requested not in KV_CACHE_DTYPE_NAMES:
            raise ValueError(f"unknown KV cache dtype {requested!r}; choose one of {', '.join(KV_CACHE_DTYPE_NAMES)}")
        return DtypeChoice(requested, f"--kv-cache-dtype {requested}")
    if dtype_requested == "auto" and compute.name == "float32" and checkpoint_dtype(model_dir) == "bfloat16":
        return DtypeChoice("bfloat16", "the checkpoint's dtype (bfloat16) under float32 compute: "
                                       "half the bytes per token for decode attention to read")
    return DtypeChoice(compute.name, f"the compute dtype ({compute.name})")
