"""Control-message latency of a worker node while long engine steps run.

Starts a storage and a worker node (W1's model, fp32, a token budget that makes each
step take seconds), keeps the engine busy with prefill-heavy work, and pings the
worker every 50 ms. Prints step times and Ping round-trip percentiles (target: p99
under 50 ms while 2-second steps run).

    python scripts/bench_control_latency.py --budget 1024 --seconds 30
"""

from __future__ import annotations

import argparse
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from shoal.transport.rpc import RpcClient
from shoal.sampling import SamplingParams


def spawn(cmd, prefix):
    proc = subprocess.Popen([sys.executable, *cmd], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    line = proc.stdout.readline().strip()
    if not line.startswith(prefix):
        raise SystemExit(f"node did not start: {line!r}")
    return proc, line.split(" ", 1)[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=".bench/model-small")
    ap.add_argument("--budget", type=int, default=1024)
    ap.add_argument("--seconds", type=float, default=30)
    args = ap.parse_args()
    if not Path(args.model, "config.json").exists():
        from shoal.nodes.worker.models.make_model import make_model

        make_model(args.model, preset="small", dtype="bfloat16")
    tmp = tempfile.mkdtemp()
    st, st_addr = spawn(["-m", "shoal.nodes.storage.storage_node", "--dir", tmp], "storage:")
    wk, wk_addr = spawn(["-m", "shoal.nodes.worker.worker_node", "--model", args.model, "--storage", st_addr,
                         "--policy", "mb", "--budget", str(args.budget)], "worker:")
    try:
        c = RpcClient(wk_addr)
        r = random.Random(0)
        params = SamplingParams(max_tokens=8, ignore_eos=True).to_dict()
        seqs = [{"seq_id": i, "item": {"id": i, "prompt_token_ids": [r.randrange(31999) for _ in range(1000)]}}
                for i in range(64)]
        c.request("AssignSequences", {"epoch": 1, "job_id": "lat", "sequences": seqs, "args": params})
        rtts = []
        end = time.monotonic() + args.seconds
        while time.monotonic() < end:
            t = time.perf_counter()
            c.request("Ping", {"sent_at": t}, timeout=30)
            rtts.append(time.perf_counter() - t)
            time.sleep(0.05)
        stats = c.request("StatsQuery", {})["stats"]
        eng = stats.get("engine", {})
        steps = max(1, eng.get("steps", 1))
        print(f"engine steps: {steps}, mean step {eng.get('time_model', 0) / steps:.2f} s (model time)")
        rtts.sort()
        pct = lambda q: 1000 * rtts[min(len(rtts) - 1, int(q * len(rtts)))]
        print(f"Ping round trips: n={len(rtts)}  p50 {pct(0.5):.1f} ms  p99 {pct(0.99):.1f} ms  max {1000 * rtts[-1]:.1f} ms")
    finally:
        for p in (wk, st):
            p.kill()
            p.wait()


if __name__ == "__main__":
    main()
