"""How many torch threads a worker runs by default: the cores the process may use.

libgomp sizes its teams by the CPU affinity mask, but a container limited by a CPU
quota (cgroup `cpu.max`, or v1's `cfs_quota_us`) still sees every core of the host:
64 threads sharing a 2-CPU quota are throttled in turn and every parallel region waits
for the slowest. The default is the smaller of the affinity mask and the quota.
"""

from __future__ import annotations

import os
from pathlib import Path

CGROUP_V2 = Path("/sys/fs/cgroup/cpu.max")
CGROUP_V1 = Path("/sys/fs/cgroup/cpu")


def quota_cpus(quota: str, period: str) -> float | None:
    """CPUs a quota and period allow (cgroup text, e.g. "200000", "100000"); None when
    unlimited ("max", or v1's -1) or unreadable."""
    try:
        q, p = float(quota), float(period)
    except ValueError:
        return None
    return q / p if q > 0 and p > 0 else None


def cgroup_cpus(v2: Path = CGROUP_V2, v1: Path = CGROUP_V1) -> float | None:
    try:
        quota, period = v2.read_text().split()[:2]
        return quota_cpus(quota, period)
    except (OSError, ValueError):
        pass
    try:
        return quota_cpus((v1 / "cpu.cfs_quota_us").read_text().strip(), (v1 / "cpu.cfs_period_us").read_text().strip())
    except OSError:
        return None


def pick_threads(affinity: int, quota: float | None) -> tuple[int, str]:
    """The thread count for `affinity` usable CPUs under a quota of `quota` CPUs (None:
    unlimited), and why: one thread per whole CPU of quota, at least one."""
    if quota is not None and int(quota) < affinity:
        return max(1, int(quota)), f"the cgroup CPU quota ({quota:g} CPUs)"
    return affinity, "the CPU affinity mask"


def cores_owned() -> tuple[int, str]:
    """This process's default thread count and why."""
    return pick_threads(len(os.sched_getaffinity(0)), cgroup_cpus())
