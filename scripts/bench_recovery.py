"""How fast the cluster notices and recovers from a dead node (real processes, kill -9):

- dead worker: from the kill to its membership record vanishing (the lease TTL), and to
  the scheduler placing its sequences again (seen as the job finishing on the other worker);
- dead scheduler leader: from the kill to a standby being elected, and to it answering
  (the takeover: job log listed from storage, workers asked what they hold).

    python scripts/bench_recovery.py --repeats 3
"""

from __future__ import annotations

import argparse
import random
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path


def wait(cond, timeout: float = 60, step: float = 0.02) -> float:
    t = time.monotonic()
    while time.monotonic() - t < timeout:
        if cond():
            return time.monotonic() - t
        time.sleep(step)
    raise TimeoutError("condition not met")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--model", default=".bench/model-tiny")
    args = ap.parse_args()
    import shoal
    from shoal.nodes.leader import Election
    from shoal.nodes.membership import MemberView
    from shoal.transport.rpc import RemoteError, RpcClient

    if not Path(args.model, "config.json").exists():
        from shoal.nodes.worker.models.make_model import make_model

        make_model(args.model, preset="tiny", dtype="float32")
    r = random.Random(0)
    items = [{"id": i, "prompt_token_ids": [r.randrange(500) for _ in range(20)], "max_tokens": 48} for i in range(24)]
    env = {"SHOAL_RPC_TIMEOUT_S": "2"}
    vanish, takeover_elected, takeover_ready = [], [], []
    for rep in range(args.repeats):
        with shoal.LocalCluster(args.model, workers=2, schedulers=2, state_dir=tempfile.mkdtemp(), policy="mb",
                                env=env, worker_args=["--threads", "1", "--budget", "64"]) as c:
            view = MemberView(c.etcd.endpoint, c.cluster).start()
            client = shoal.Client(c.router, reply_timeout=3)
            job = client.submit(items, params={"ignore_eos": True}, job_key=f"w{rep}")
            wait(lambda: job.status()["done"] >= 2, 120)
            c.process("worker-1").send_signal(signal.SIGKILL)
            vanish.append(wait(lambda: "worker-1" not in view.snapshot("worker")))
            election = Election(c.etcd.endpoint, c.cluster, "bench")
            leader, epoch = election.current()
            c.process(leader).send_signal(signal.SIGKILL)
            t = time.monotonic()
            takeover_elected.append(wait(lambda: election.current()[1] > epoch, step=0.01))

            def answers() -> bool:
                try:
                    RpcClient(c.router).request("JobStatusQuery", {"job_id": job.id}, timeout=1)
                    return True
                except (RemoteError, TimeoutError):
                    return False

            wait(answers, step=0.05)
            takeover_ready.append(time.monotonic() - t)
            assert len(job.wait(timeout=300)) == len(items)
            view.stop()
        print(f"run {rep + 1}: dead worker gone from membership after {vanish[-1]:.2f} s; standby elected after "
              f"{takeover_elected[-1]:.2f} s, answering after {takeover_ready[-1]:.2f} s", flush=True)
    med = statistics.median
    print(f"median of {args.repeats}: dead worker detected in {med(vanish):.2f} s (lease TTL 3 s); "
          f"standby leader elected in {med(takeover_elected):.2f} s, serving in {med(takeover_ready):.2f} s")


if __name__ == "__main__":
    sys.exit(main())
