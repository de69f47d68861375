"""The KV cache's default size: a share of the memory free on this host when the worker
starts, and how much of it to commit up front.

A fixed size is wrong both ways: on a small machine it takes memory the job needs, and on
a large one it throws away prefix reuse the job could have had (W3's fp32 contexts on a
24 GiB machine: 4 GiB kept 81k of its 672k prompt tokens for the next hop, 12 GiB 172k,
and the engine computed 15% fewer). vLLM's CPU build likewise sizes its own cache from
the machine's memory unless told (`VLLM_CPU_KVCACHE_SPACE`). Shoal takes half of what is
available once the model has loaded (the other half is for the offload buffer, an
encoder, the other nodes of a local cluster, the index and the OS), divided among the
workers of the host. It is a reading at one moment: workers of a local cluster start
together, and one may read it before another has loaded its model; the half left over
covers that.

Only the first `PREFAULT_BYTES` are written at start (start-up pays 1.2-2.3 s per GiB on
the VMs measured). The block manager hands out never-used blocks lowest id first (before
reusing freed ones, to keep the prefix cache), so a job runs in committed memory until it
has written 4 GiB of KV in all; beyond that, pages are committed as they are first
written, inside the steps that write them, and only by jobs that get that far.
"""

from __future__ import annotations

from pathlib import Path

DEFAULT_SHARE = 0.5  # of the memory available at start, for all the host's workers together
PREFAULT_BYTES = 4 << 30  # committed at start when prefaulting; the rest as it is first written
MIN_BYTES = 256 << 20  # below this a cache holds too little to be worth running
UNKNOWN_BYTES = 4 << 30  # the default share's size where the free memory cannot be read

MEMINFO = Path("/proc/meminfo")
PROC_CGROUP = Path("/proc/self/cgroup")
CGROUP_V2 = Path("/sys/fs/cgroup")
CGROUP_V1 = Path("/sys/fs/cgroup/memory")
NO_LIMIT = 1 << 60  # cgroup v1 writes "no limit" as a number near 2^63


def meminfo_available(meminfo: Path = MEMINFO) -> int | None:
    """MemAvailable of /proc/meminfo in bytes (what can be allocated without swapping)."""
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
        return None if text == "max" else int(text)
    except (OSError, ValueError):
        return None


def _stat(folder: Path, key: str) -> int:
    """One counter of a cgroup's memory.stat (0 where absent)."""
    try:
        for line in (folder / "memory.stat").read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == key:
                return int(value)
    except (OSError, ValueError):
        pass
    return 0


def own_cgroups(proc_cgroup: Path = PROC_CGROUP) -> tuple[str | None, str | None]:
    """This process's cgroup paths: (v2's, v1 memory controller's); None where absent."""
    v2 = v1 = None
    try:
        for line in proc_cgroup.read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            if controllers == "":
                v2 = path
            elif "memory" in controllers.split(","):
                v1 = path
    except (OSError, ValueError):
        pass
    return v2, v1


def _folder(root: Path, path: str) -> Path:
    """The folder of cgroup `path` under the mount `root`, or `root` itself where the path
    is not visible there (a container's cgroup namespace shows its own cgroup as the root)."""
    folder = root / path.lstrip("/")
    return folder if folder.is_dir() else root


def cgroup_headroom(proc_cgroup: Path = PROC_CGROUP, v2_root: Path = CGROUP_V2,
                    v1_root: Path = CGROUP_V1) -> int | None:
    """Bytes this process's memory cgroups let it still take: the least, over its cgroup
    and their ancestors, of the limit less the usage, where usage leaves out the page
    cache the kernel would reclaim first (inactive files: the model just read, as docker
    and the kubelet count it). None where no cgroup sets a limit."""
    v2_path, v1_path = own_cgroups(proc_cgroup)
    room = []
    if v2_path is not None:  # cgroup v2: memory.max on the process's cgroup or any ancestor
        folder = _folder(v2_root, v2_path)
        while True:
            limit = _read_int(folder / "memory.max")
            if limit is not None:
                used = (_read_int(folder / "memory.current") or 0) - _stat(folder, "inactive_file")
                room.append(limit - max(0, used))
            if folder == v2_root or folder.parent == folder:
                break
            folder = folder.parent
    if v1_path is not None:  # cgroup v1: memory.stat's hierarchical limit covers the ancestors
        folder = _folder(v1_root, v1_path)
        limit = _stat(folder, "hierarchical_memory_limit") or _read_int(folder / "memory.limit_in_bytes")
        if limit is not None and limit < NO_LIMIT:
            used = (_read_int(folder / "memory.usage_in_bytes") or 0) - _stat(folder, "total_inactive_file")
            room.append(limit - max(0, used))
    return max(0, min(room)) if room else None


def available_memory() -> tuple[int | None, str]:
    """The memory this process could still take, and where the figure comes from."""
    avail, headroom = meminfo_available(), cgroup_headroom()
    if headroom is not None and (avail is None or headroom < avail):
        return headroom, "the memory cgroup's limit less its usage"
    return avail, "MemAvailable"


def check_share(share: float) -> float:
    if not 0 < share <= 1:
        raise ValueError(f"the KV cache's share of available memory must be in (0, 1], not {share}")
    return share


def default_kv_cache_bytes(available: int | None, share: float = DEFAULT_SHARE) -> tuple[int, str]:
    """The cache size for a worker given `available` bytes free (None: unknown) and its
    `share` of them, and why."""
    check_share(share)
    if available is None:
        size = max(MIN_BYTES, int(UNKNOWN_BYTES * share / DEFAULT_SHARE))
        return size, f"{size / 2**30:.1f} GiB (the host's free memory is unknown)"
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
