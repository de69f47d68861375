"""Many one-token items through a local cluster: throughput, the first result, and each
process's memory, at two job sizes (a benchmark, not a test).

    python scripts/bench_many_items.py                         # 100,000 then 1,000,000 items
    python scripts/bench_many_items.py --sizes 20000,100000    # smaller

Each size runs on a fresh local cluster (the tiny model, one worker): the items are
submitted by the SDK as an upload, the results read as they are stored. Printed per
size: items/s end to end (submit to the last result read), the time to the first
result, each process's peak RSS (sampled every 0.2 s), each process's share of a core
over the job (what limits throughput is the one near 100%), and storage's RSS once the
job is done and compacted (its idle size is measured before the job). The targets: each
process's peak at 1M within 10% of its peak at 100k; storage back near its idle size
after the job; >= 10,000 items/s (at one token on the tiny model the engine is not the
limit: the per-item work of the control plane is, which the stage timings show).
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


def cpu_seconds(pid: int) -> float:
    import psutil

    try:
        t = psutil.Process(pid).cpu_times()
        return t.user + t.system
    except psutil.Error:
        return 0.0


def rss_mib(pid: int) -> float:
    import psutil

    try:
        return psutil.Process(pid).memory_info().rss / 2**20
    except psutil.Error:
        return 0.0


class Sampler:
    """Each node process's peak RSS while it runs."""

    def __init__(self, pids: dict[str, int]):
        self.pids, self.peak = pids, {name: 0.0 for name in pids}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            for name, pid in self.pids.items():
                self.peak[name] = max(self.peak[name], rss_mib(pid))
            time.sleep(0.2)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def run_size(model: str, n: int, work: Path) -> dict:
    import shoal
    from shoal.transport.rpc import RpcClient

    import shutil

    items = [{"id": i, "prompt_token_ids": [1 + i % 400, 7], "max_tokens": 1} for i in range(n)]
    shutil.rmtree(work / f"c{n}", ignore_errors=True)  # a fresh cluster: no job of an earlier run
    with shoal.LocalCluster(model, state_dir=work / f"c{n}", dtype="float32", policy="mb",
                            worker_args=["--threads", "1"]) as c:
        pids = {name: proc.pid for name, (proc, _, _) in c.nodes.items()}
        storage = next(name for name in pids if name.startswith("storage"))
        idle = rss_mib(pids[storage])
        client = shoal.Client(c.router, timeout=600)
        with Sampler(pids) as sampler:
            cpu0 = {name: cpu_seconds(pid) for name, pid in pids.items()}
            t0 = time.perf_counter()
            job = client.submit(items, params={"ignore_eos": True})
            submitted = time.perf_counter() - t0
            first, count = None, 0
            for _ in job.results():
                count += 1
                if first is None:
                    first = time.perf_counter() - t0
            wall = time.perf_counter() - t0
            # Each process's share of one core over the job: what limits it is the one near 100%.
            busy = {name: (cpu_seconds(pid) - cpu0[name]) / wall for name, pid in pids.items()}
        # Compaction runs on its own thread after the last result: give it its moment.
        deadline = time.monotonic() + 120
        stats = {}
        while time.monotonic() < deadline:
            stats = RpcClient(c.nodes[storage][2]).request("StatsQuery", timeout=10)["stats"]
            if stats.get("result_logs", {}).get("running", 1) == 0:
                break
            time.sleep(0.5)
        after = rss_mib(pids[storage])
    assert count == n, f"{count} results for {n} items"
    return {"n": n, "items_per_s": n / wall, "first_s": first, "submit_s": submitted, "wall_s": wall,
            "peak_mib": sampler.peak, "cpu_share": busy, "storage_idle_mib": idle, "storage_after_mib": after,
            "result_logs": stats.get("result_logs")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="100000,1000000")
    ap.add_argument("--work", default=".bench/many-items")
    args = ap.parse_args()
    work = Path(args.work)
    model = work / "model-tiny"
    if not (model / "config.json").exists():
        from shoal.nodes.worker.models.make_model import make_model

        make_model(model, preset="tiny", dtype="float32")
    rows = []
    for n in (int(x) for x in args.sizes.split(",")):
        r = run_size(str(model), n, work)
        rows.append(r)
        peaks = ", ".join(f"{k} {v:.0f}" for k, v in sorted(r["peak_mib"].items()))
        print(f"{n:>9,} items: {r['items_per_s']:,.0f} items/s end to end ({r['wall_s']:.1f} s; submit "
              f"{r['submit_s']:.1f} s; first result after {r['first_s']:.1f} s); peak RSS MiB: {peaks}; storage "
              f"{r['storage_idle_mib']:.0f} MiB idle, {r['storage_after_mib']:.0f} MiB after the job "
              f"({r['result_logs']})", flush=True)
        shares = ", ".join(f"{k} {v:.0%}" for k, v in sorted(r["cpu_share"].items(), key=lambda kv: -kv[1]))
        print(f"{'':>9}  each process's share of a core over the job (submit included): {shares}", flush=True)
    if len(rows) >= 2:
        a, b = rows[0], rows[-1]
        growth = ", ".join(f"{k} {b['peak_mib'][k] / max(a['peak_mib'][k], 1e-9):.2f}x"
                           for k in sorted(a["peak_mib"]) if k in b["peak_mib"])
        print(f"peak RSS at {b['n']:,} over {a['n']:,} items: {growth} (target: within 1.10x)")


if __name__ == "__main__":
    main()
