"""Time to drain a worker holding N sequences mid-generation.

A local cluster of 2 workers; a job of N long sequences (prompts of 128-256 tokens,
long outputs) all moved to worker-1; once they are generating, worker-1 is drained
and the clock runs until its process has exited (every sequence moved to worker-0 with
its KV, results and checkpoints flushed, the node gone from the membership).

    python scripts/bench_drain.py --counts 8,32,64
"""

from __future__ import annotations

import argparse
import random
import time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=".bench/model-small")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--counts", default="8,32,64")
    args = ap.parse_args()
    import shoal
    from shoal.transport.rpc import RpcClient

    r = random.Random(0)
    for n in (int(x) for x in args.counts.split(",")):
        items = [{"id": i, "prompt_token_ids": [r.randrange(31999) for _ in range(r.randint(128, 256))],
                  "max_tokens": 3000} for i in range(n)]
        with shoal.LocalCluster(args.model, workers=2, dtype=args.dtype, policy="mb", worker_threads=1,
                                scheduler_args=["--no-steal"]) as c:
            client = shoal.Client(c.router)
            job = client.submit(items, params={"ignore_eos": True})
            w1 = RpcClient(c.nodes["worker-1"][2])

            def on_w1() -> int:
                k = w1.request("StatsQuery")["stats"]["counters"]
                return k.get("sequences.assigned", 0) + k.get("sequences.imported", 0)

            while on_w1() < n:  # until the scheduler placed them all and every one is on worker-1
                client.migrate(job.id, "worker-1")
                time.sleep(0.2)
            while w1.request("StatsQuery")["stats"].get("sequences", {}).get("in_engine", 0) < n:
                time.sleep(0.1)
            time.sleep(2.0)  # let them prefill and generate
            held = w1.request("StatsQuery")["stats"]["sequences"]["resident"]
            t = time.perf_counter()
            client.drain("worker-1")
            code = c.process("worker-1").wait(timeout=600)
            took = time.perf_counter() - t
            w0 = RpcClient(c.nodes["worker-0"][2]).request("StatsQuery")["stats"]["counters"]
            client.job(job.id).cancel()
        print(f"drained a worker holding {held} sequences in {took:.2f} s (exit code {code}); "
              f"worker-0 imported {w0.get('sequences.imported', 0)}", flush=True)


if __name__ == "__main__":
    main()
