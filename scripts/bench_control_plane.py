"""The real control plane at cluster scale: one scheduler (and a standby), router and
storage, with 16 to 128 simulated workers speaking the real protocol.

The workers live in a few host processes (`shoal.nodes.sim_worker_host`: no torch, no
model). Each registers in etcd under its own lease, runs up to --max-seqs sequences at
once for the seconds its item names (log-normal around --seq-seconds), and delivers
what finished as a real worker does: results to storage until acknowledged, then a
progress report to the leader, one delivery at a time and at most every --report-every
seconds. The scheduler refills the slots each report frees.

For each cluster size it measures, over a steady window: the messages the scheduler
takes per second, the assignments it sends, p50/p99 of the decision latency (from a
worker's progress report to the next assignment that worker receives, as the worker
sees it) and of the report's acknowledgement, the scheduler's CPU (psutil) and that of
the rest; then kills the leader with SIGKILL and times the standby's takeover: until it
serves requests, and until results flow again.

    python scripts/bench_control_plane.py --workers 16,32,64,128
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sys
import tempfile
import time
from pathlib import Path

import orjson
import psutil

from shoal.sdk.client import Client
from shoal.cluster.local_cluster import LocalCluster
from shoal.cluster.node_process import spawn_node
from shoal.nodes.latency_histogram import percentile, window
from shoal.nodes.membership import MemberView
from shoal.transport.rpc import RemoteError, RpcClient


def stats(address: str) -> dict:
    return RpcClient(address).request("StatsQuery", {}, timeout=30)["stats"]


def cpu_s(pid: int) -> float:
    t = psutil.Process(pid).cpu_times()
    return t.user + t.system


def write_items(path: Path, n: int, mean_s: float, seed: int = 0) -> None:
    """n items whose run time is log-normal (sigma 0.6) with the given mean."""
    import math

    r = random.Random(seed)
    mu = math.log(mean_s) - 0.6 ** 2 / 2
    with open(path, "wb") as f:
        for i in range(n):
            s = r.lognormvariate(mu, 0.6)
            f.write(orjson.dumps({"id": i, "sim_s": round(s, 3), "sim_tokens": int(s * 40)}) + b"\n")


def leader_of(cluster: LocalCluster, schedulers: int) -> tuple[str, str]:
    for i in range(schedulers):
        name = f"scheduler-{i}"
        address = cluster.nodes[name][2]
        try:
            if stats(address).get("leader"):
                return name, address
        except (TimeoutError, RemoteError):
            continue
    raise RuntimeError("no scheduler leads")


def measure(n_workers: int, args) -> dict:
    state = Path(tempfile.mkdtemp(prefix="shoal-cp-"))
    cluster = LocalCluster(model="sim", workers=0, schedulers=2, state_dir=state,
                           scheduler_args=[] if args.steal else ["--no-steal"]).start()
    hosts = []
    try:
        per_host = -(-n_workers // args.hosts)
        for h in range(args.hosts):
            count = min(per_host, n_workers - h * per_host)
            if count <= 0:
                break
            proc, address = spawn_node("simhost", f"simhost-{h}", [
                "--etcd", cluster.etcd.endpoint, "--cluster", cluster.cluster, "--workers", str(count),
                "--prefix", f"w{h}-", "--max-seqs", str(args.max_seqs), "--report-every", str(args.report_every)],
                state / "logs", die_with_parent=True)
            hosts.append((proc, address))
            if args.nice_hosts:  # the simulated GPUs yield the shared cores to the control plane
                os.setpriority(os.PRIO_PROCESS, proc.pid, args.nice_hosts)
        view = MemberView(cluster.etcd.endpoint, cluster.cluster).start()
        if not view.wait_for(lambda m: sum(1 for x in m.values() if x.role == "worker") >= n_workers, 60):
            raise RuntimeError("the simulated workers did not all register")
        view.stop()

        capacity = n_workers * args.max_seqs
        total = int(capacity * ((args.warmup + args.seconds + args.takeover_margin) / args.seq_seconds + 3))
        items = state / "items.jsonl"
        write_items(items, total, args.seq_seconds)
        client = Client(cluster.router)
        t = time.monotonic()
        job = client.submit(input_path=str(items), program="bench.sim:program", job_key=f"cp-{n_workers}")
        submit_s = time.monotonic() - t

        time.sleep(args.warmup)
        leader, leader_addr = leader_of(cluster, 2)
        pid = cluster.process(leader).pid
        others = {name: p.pid for name, (p, _, _) in cluster.nodes.items() if name != leader}
        others.update({f"simhost-{h}": p.pid for h, (p, _) in enumerate(hosts)})
        others["etcd"] = cluster.etcd.proc.pid

        def snapshot():
            return (time.monotonic(), stats(leader_addr), [stats(a) for _, a in hosts], cpu_s(pid),
                    {k: cpu_s(v) for k, v in others.items()}, job.status()["done"])

        t0, s0, h0, c0, o0, d0 = snapshot()
        time.sleep(args.seconds)
        t1, s1, h1, c1, o1, d1 = snapshot()
        dt = t1 - t0

        def received(s):
            return sum(v for k, v in s["counters"].items() if k.startswith("messages."))

        def hist(hs, key):
            return [sum(c) for c in zip(*(h[key] for h in hs))]

        def ep_counter(hs, key):
            return sum(h["endpoint_counters"].get(key, 0) for h in hs)

        decision = window(hist(h0, "decision_hist"), hist(h1, "decision_hist"))
        report_ack = window(hist(h0, "report_ack_hist"), hist(h1, "report_ack_hist"))
        inside = window(s0["decision_hist"], s1["decision_hist"])
        row = {
            "workers": n_workers, "items": total, "submit_s": submit_s,
            "held": sum(h["held"] for h in h1), "capacity": capacity,
            "msgs_per_s": (received(s1) - received(s0)) / dt,
            "reports_per_s": (s1["counters"].get("messages.ProgressReport", 0)
                              - s0["counters"].get("messages.ProgressReport", 0)) / dt,
            "assigns_per_s": (ep_counter(h1, "messages.AssignSequences") - ep_counter(h0, "messages.AssignSequences")) / dt,
            "moves_per_s": (ep_counter(h1, "messages.MigrateSequences") - ep_counter(h0, "messages.MigrateSequences")) / dt,
            "results_per_s": (d1 - d0) / dt,
            "decision_p50_ms": 1e3 * (percentile(decision, 50) or 0), "decision_p99_ms": 1e3 * (percentile(decision, 99) or 0),
            "decisions": sum(decision),
            "inside_p50_ms": 1e3 * (percentile(inside, 50) or 0), "inside_p99_ms": 1e3 * (percentile(inside, 99) or 0),
            "ack_p50_ms": 1e3 * (percentile(report_ack, 50) or 0), "ack_p99_ms": 1e3 * (percentile(report_ack, 99) or 0),
            "scheduler_cpu": (c1 - c0) / dt,
            "other_cpu": {k: round((o1[k] - o0[k]) / dt, 2) for k in o0},
            "outbox_resent": sum(h["outbox_resent"] for h in h1),
        }

        # Takeover: the leader dies without a word; the standby is timed until it serves
        # a request, and until results are stored again.
        standby = next(f"scheduler-{i}" for i in range(2) if f"scheduler-{i}" != leader)
        sb = RpcClient(cluster.nodes[standby][2])
        def reported():  # results whose progress reports a leader acknowledged
            return sum(stats(a)["endpoint_counters"].get("results.reported", 0) for _, a in hosts)

        reported_before = reported()
        os.kill(pid, signal.SIGKILL)
        t_kill = time.monotonic()
        serving = resumed = None
        while time.monotonic() - t_kill < 120 and (serving is None or resumed is None):
            if serving is None:
                try:
                    sb.request("JobStatusQuery", {"job_id": job.id}, timeout=5)
                    serving = time.monotonic() - t_kill
                except (RemoteError, TimeoutError):
                    pass
            if serving is not None and resumed is None and reported() > reported_before + n_workers:
                resumed = time.monotonic() - t_kill
            time.sleep(0.05)
        row["takeover_serving_s"], row["takeover_resumed_s"] = serving, resumed
        row["takeover_rebuild_s"] = stats(cluster.nodes[standby][2])["takeover_s"]  # after the lease ran out
        client.close()
        return row
    finally:
        for proc, _ in hosts:
            proc.terminate()
        for proc, _ in hosts:
            try:
                proc.wait(10)
            except Exception:
                proc.kill()
        cluster.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workers", default="16,32,64,128", help="cluster sizes, comma-separated")
    ap.add_argument("--hosts", type=int, default=4, help="processes the simulated workers share")
    ap.add_argument("--max-seqs", type=int, default=256)
    ap.add_argument("--seq-seconds", type=float, default=10.0, help="mean run time of a sequence")
    ap.add_argument("--report-every", type=float, default=0.25)
    ap.add_argument("--warmup", type=float, default=8.0)
    ap.add_argument("--seconds", type=float, default=20.0, help="the measured window")
    ap.add_argument("--takeover-margin", type=float, default=30.0, help="work left for after the takeover")
    ap.add_argument("--no-steal", dest="steal", action="store_false")
    ap.add_argument("--nice-hosts", type=int, default=0,
                    help="run the simulated workers at this nice value: on a machine with few cores, the control "
                         "plane then gets the CPU first, as it would on hosts of its own")
    ap.add_argument("--json", default=".bench/control_plane.json", help="the rows, and a PNG plot beside them")
    args = ap.parse_args()
    cpu = open("/proc/cpuinfo").read()
    flags = [f for f in ("avx2", "avx512f", "avx512_bf16") if f" {f}" in cpu]
    print(f"# {os.cpu_count()} cores ({' '.join(flags)}); {args.hosts} host processes; max_seqs {args.max_seqs}; "
          f"sequences ~{args.seq_seconds:g} s; a delivery at most every {args.report_every:g} s per worker"
          + (f"; simulated workers at nice {args.nice_hosts}" if args.nice_hosts else ""), flush=True)
    rows = []
    for n in [int(x) for x in args.workers.split(",")]:
        row = measure(n, args)
        rows.append(row)
        print(orjson.dumps(row).decode(), flush=True)
    print("\n| workers | msgs/s in | assigns/s | results/s | decision in scheduler p50 / p99 ms "
          "| decision at worker p50 / p99 ms | report ack p50 / p99 ms | scheduler CPU | takeover: serving / results again (rebuild) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['workers']} | {r['msgs_per_s']:.0f} | {r['assigns_per_s']:.0f} | {r['results_per_s']:.0f} | "
              f"{r['inside_p50_ms']:.1f} / {r['inside_p99_ms']:.1f} | "
              f"{r['decision_p50_ms']:.1f} / {r['decision_p99_ms']:.1f} | {r['ack_p50_ms']:.1f} / {r['ack_p99_ms']:.1f} | "
              f"{r['scheduler_cpu']:.2f} | {r['takeover_serving_s'] or float('nan'):.1f} s / "
              f"{r['takeover_resumed_s'] or float('nan'):.1f} s ({r['takeover_rebuild_s']:.2f} s) |")
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"args": vars(args), "cpu": f"{os.cpu_count()} cores {' '.join(flags)}", "rows": rows},
                              indent=2))
    from plots import line_plot

    line_plot(out.with_suffix(".png"), [r["workers"] for r in rows], [
        {"ylabel": "decision latency (ms)", "log": True, "series": {
            "in scheduler p50": [r["inside_p50_ms"] for r in rows], "in scheduler p99": [r["inside_p99_ms"] for r in rows],
            "at worker p50": [r["decision_p50_ms"] for r in rows], "at worker p99": [r["decision_p99_ms"] for r in rows]}},
        {"ylabel": "per second", "series": {"messages in": [r["msgs_per_s"] for r in rows],
                                            "assignments": [r["assigns_per_s"] for r in rows],
                                            "results": [r["results_per_s"] for r in rows]}},
        {"ylabel": "scheduler CPU (cores)", "series": {"scheduler": [r["scheduler_cpu"] for r in rows]}},
    ], "workers", "the control plane as the cluster grows")


if __name__ == "__main__":
    sys.exit(main())
