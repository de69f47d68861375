"""What a benchmark reads from a local cluster: its worker's StatsQuery answer, the
CPU seconds of its processes, and what the kernel says of a process's threads."""

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



def thread_clocks(pid: int | str = "self") -> dict[int, tuple[float, float, int]]:
    """Each thread of a process: (seconds on a CPU, seconds runnable but waiting for one,
    times scheduled in), from /proc/PID/task/*/schedstat (Linux with schedstats; empty
    elsewhere). The engine's threads fill every core, so the time they wait on a run
    queue is the time other threads and processes ran on their cores; an engine alone on
    the machine waits almost none."""
    from pathlib import Path

    out = {}
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            on_cpu, waiting, runs = map(int, (task / "schedstat").read_text().split()[:3])
        except (OSError, ValueError):  # the thread ended between the listing and the read
            continue
        out[int(task.name)] = (on_cpu / 1e9, waiting / 1e9, runs)
    return out


def compute_threads(before: dict, after: dict, threads: int) -> dict:
    """Between two `thread_clocks` readings: the `threads` threads that ran the most (the
    engine's; a worker's others move bytes), their sums, and what the process's other
    threads ran. Chosen by what they ran in between, not before: a thread that loaded a
    model and then idled is not a compute thread."""
    spent = {tid: tuple(a - b for a, b in zip(after[tid], before.get(tid, (0.0, 0.0, 0)))) for tid in after}
    busiest = sorted(spent, key=lambda tid: -spent[tid][0])[:threads]
    return {"compute_cpu": sum(spent[t][0] for t in busiest), "compute_wait": sum(spent[t][1] for t in busiest),
            "compute_runs": sum(spent[t][2] for t in busiest),
            "other_threads_cpu": sum(s[0] for t, s in spent.items() if t not in busiest)}
