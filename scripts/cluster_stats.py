"""What a benchmark reads from a local cluster: its worker's StatsQuery answer, and the
CPU seconds of its processes."""

from __future__ import annotations


def worker_stats(cluster, name: str = "worker-0") -> dict:
    from shoal.transport.rpc import RpcClient

    rpc = RpcClient(cluster.nodes[name][2])
    try:
        return rpc.request("StatsQuery", {}, timeout=10)["stats"]
    finally:
        rpc.close()


def node_cpu_seconds(cluster) -> dict[str, float]:
    """CPU seconds (user + system) each role's processes and etcd have used so far: on a
    machine whose cores the engine's threads fill, every other process's CPU time
    delays a step, and a parallel region waits for its slowest thread."""
    import psutil

    out: dict[str, float] = {}
    for name, proc in [*((n, v[0]) for n, v in cluster.nodes.items()), ("etcd", cluster.etcd.proc)]:
        role = name.split("-")[0]
        try:
            t = psutil.Process(proc.pid).cpu_times()
            out[role] = out.get(role, 0.0) + t.user + t.system
        except psutil.Error:  # exited meanwhile
            pass
    return out


def compute_threads_schedstat(pid: int | str = "self", threads: int = 2) -> tuple[float, float, int]:
    """(seconds on a CPU, seconds runnable but waiting for one, times scheduled in) of a
    process's `threads` busiest threads, from /proc/PID/task/*/schedstat (Linux with
    schedstats; zeros elsewhere). The engine's threads fill every core, so the time
    they wait on a run queue is the time other threads and processes ran on their cores;
    an engine alone on the machine waits almost none."""
    from pathlib import Path

    rows = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            on_cpu, waiting, slices = map(int, (task / "schedstat").read_text().split()[:3])
        except (OSError, ValueError):
            continue
        rows.append((on_cpu / 1e9, waiting / 1e9, slices))
    rows.sort(reverse=True)
    busiest = rows[:threads]
    return sum(r[0] for r in busiest), sum(r[1] for r in busiest), sum(r[2] for r in busiest)


def schedstat_delta(before: tuple, after: tuple) -> tuple[float, float, int]:
    return tuple(b - a for a, b in zip(before, after))
