"""The KV cache's default size: a share of the memory free on this host when the worker
starts, and how much of it to commit up front.

A fixed size is wrong both ways: on a small machine it takes memory the job needs, and on
a large one it throws away prefix reuse the job could have had (W3's fp32 contexts on a
24 GiB machine: 4 GiB kept 81k of its 672k prompt tokens for the next hop, 12 GiB 172k,
and the engine computed 15% fewer). vLLM's CPU build likewise sizes its cache from the
machine's memory unless told (`VLLM_CPU_KVCACHE_SPACE`). Shoal takes half of what is
available after the model has loaded (the other half is for the offload buffer, the other
nodes of a local cluster, the index and the OS), divided among the workers of the host.

Only the first `PREFAULT_BYTES` are written at start (start-up pays 1.2-2.3 s per GiB on
the VMs measured); blocks are handed out lowest id first (`block_manager.py`), so a job
runs in committed memory until it outgrows those 4 GiB, and the rest is committed page by
page as it is first written, only by jobs that use it.
"""

from __future__ import annotations

from pathlib import Path

DEFAULT_SHARE = 0.5  # of the memory available at start, for all the host's workers together
PREFAULT_BYTES = 4 << 30  # committed at start when prefaulting; the rest as it is first written
MIN_BYTES = 256 << 20  # below this a cache holds too little to be worth running

MEMINFO = Path("/proc/meminfo")
CGROUP_V2 = Path("/sys/fs/cgroup")
CGROUP_V1 = Path("/sys/fs/cgroup/memory")


def meminfo_available(meminfo: Path = MEMINFO) -> int | None:
    """MemAvailable of /proc/meminfo in bytes (what can be allocated without swapping)."""
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def cgroup_headroom(v2: Path = CGROUP_V2, v1: Path = CGROUP_V1) -> int | None:
    """Bytes this process's memory cgroup may still grow by (limit minus usage), or None
    where there is no limit."""
    for limit_file, usage_file in ((v2 / "memory.max", v2 / "memory.current"),
                                   (v1 / "memory.limit_in_bytes", v1 / "memory.usage_in_bytes")):
        try:
            limit = limit_file.read_text().strip()
            if limit == "max" or int(limit) >= 1 << 60:  # v1 writes "no limit" as a huge number
                return None
            return max(0, int(limit) - int(usage_file.read_text().strip()))
        except (OSError, ValueError):
            continue
    return None


def available_memory() -> tuple[int | None, str]:
    """The memory this process could still take, and where the figure comes from."""
    avail, headroom = meminfo_available(), cgroup_headroom()
    if headroom is not None and (avail is None or headroom < avail):
        return headroom, "the memory cgroup's limit less its usage"
    return avail, "MemAvailable"


def default_kv_cache_bytes(available: int | None, share: float = DEFAULT_SHARE,
                           fallback: int = 4 << 30) -> tuple[int, str]:
    """The cache size for a worker given `available` bytes free (None: unknown) and its
    `share` of them, and why."""
    if not 0 < share <= 1:
        raise ValueError(f"the KV cache's share of available memory must be in (0, 1], not {share}")
    if available is None:
        return fallback, f"{fallback / 2**30:.1f} GiB (the host's free memory is unknown)"
    size = max(MIN_BYTES, int(available * share))
    return size, f"{share:.0%} of the {available / 2**30:.1f} GiB available at start"


def choose_kv_cache_bytes(explicit: int | None, share: float = DEFAULT_SHARE) -> tuple[int, str]:
    """`explicit` where given, else the default for `share` of what is available now; and
    why, for the worker's log."""
    if explicit is not None:
        if explicit <= 0:
            raise ValueError(f"the KV cache needs a positive size, not {explicit} bytes")
        return explicit, "as set (kv_cache_bytes / --kv-cache-bytes)"
    avail, source = available_memory()
    size, why = default_kv_cache_bytes(avail, share)
    return size, f"auto: {why} ({source})"
