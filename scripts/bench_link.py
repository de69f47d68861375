"""Ship a moving sequence's KV or re-prefill it, over a real rate-limited link, at three
link rates, against what the rule (`scheduler/kv_transfer.py`) chose.

A network namespace stands for the target's host, joined to this one by a link with the
given rate and one-way delay (`link_emulator.py`, a user-space switch on TAP devices). Two engines
in this process compute the moves (as `bench_migration.py` does); the KV blob crosses
the shaped link to a receiver in the namespace in 4 MiB chunks, each acknowledged, as
the mover sends it. For each rate and prompt length: the measured ship and re-prefill
times, which was faster, and what the rule chose given the link's rate and this
device's calibration. Needs root and iproute2.

    python scripts/bench_link.py --rates 10,100,1000 --lengths 256,1024 --repeats 2
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_migration import measure_move, source_and_target  # noqa: E402

RECEIVER = """
import sys, zmq
ctx = zmq.Context()
rx = ctx.socket(zmq.PAIR)
rx.bind(sys.argv[1])
print("ready", flush=True)
while True:
    msg = rx.recv(copy=False)
    if msg.bytes == b"stop":
        break
    rx.send(b"ack")
"""


class ShapedLink:
    """This namespace (10.215.0.1) joined to namespace `shoal-link` (10.215.0.2) through
    the user-space link emulator (`link_emulator.py`: rate, delay and loss on kernels
    without netem)."""

    NS, GATEWAY = "shoal-link", "shl-gw"

    def __enter__(self):
        self.close()
        subprocess.run(["ip", "netns", "add", self.NS], check=True, capture_output=True)
        self.switch = subprocess.Popen([sys.executable, str(Path(__file__).resolve().parent / "link_emulator.py"),
                                        "--gateway", f"{self.GATEWAY}=10.215.0.1/24", "--host", f"{self.NS}=10.215.0.2/24"],
                                       stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        if self.switch.stdout.readline().strip() != "ready":
            raise SystemExit(f"the link emulator did not start (exit {self.switch.wait(10)})")
        return self

    def shape(self, mbit: int, delay_ms: float) -> str:
        self.switch.stdin.write(f"shape {self.NS} {mbit} {delay_ms} 0\n")
        self.switch.stdin.flush()
        answer = self.switch.stdout.readline().strip()
        if answer != "ok":
            raise SystemExit(f"link emulator: {answer}")
        return f"{mbit} Mbit/s, {delay_ms} ms each way"

    def close(self, *exc) -> None:
        switch = getattr(self, "switch", None)
        if switch is not None:
            switch.stdin.close()
            switch.wait(timeout=10)
            self.switch = None
        subprocess.run(["ip", "netns", "del", self.NS], capture_output=True)

    __exit__ = close


class LinkSender:
    """Sends a blob to the receiver across the link, in 4 MiB chunks each acknowledged."""

    def __init__(self, chunk: int = 4 << 20):
        import zmq

        self.chunk = chunk
        self.proc = subprocess.Popen(["ip", "netns", "exec", ShapedLink.NS, sys.executable, "-c", RECEIVER,
                                      "tcp://10.215.0.2:5599"], stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout.readline().strip() == "ready"
        self.tx = zmq.Context.instance().socket(zmq.PAIR)
        self.tx.connect("tcp://10.215.0.2:5599")

    def __call__(self, blob: bytes) -> float:
        start = time.perf_counter()
        for i in range(0, len(blob), self.chunk):
            self.tx.send(blob[i:i + self.chunk], copy=False)
            self.tx.recv()
        return time.perf_counter() - start

    def close(self) -> None:
        self.tx.send(b"stop")
        self.proc.wait(timeout=10)
        self.tx.close(0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=".bench/model-small")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--rates", default="10,100,1000", help="link rates in Mbit/s")
    ap.add_argument("--lengths", default="256,1024")
    ap.add_argument("--delay-ms", type=float, default=1.0, help="one-way delay of the link")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("bench_link.py makes a network namespace: run it as root")

    from shoal.scheduler.kv_transfer import decide_kv

    src, dst, cost, params = source_and_target(args.model, args.dtype)
    r = random.Random(0)
    print(f"{'link':>28} {'L':>6} {'KV MB':>7} {'ship ms':>9} {'re-prefill ms':>14} {'faster':>11} {'rule':>11}")
    right = total = 0
    with ShapedLink() as link:
        for mbit in (int(x) for x in args.rates.split(",")):
            shaped = link.shape(mbit, args.delay_ms)
            sender = LinkSender()
            try:
                for n, L in enumerate(int(x) for x in args.lengths.split(",")):
                    ship, _, redo, size = measure_move(src, dst, L, params, args.repeats, sender, r, f"l{mbit}-{n}")
                    s_ms, r_ms = 1e3 * statistics.median(ship), 1e3 * statistics.median(redo)
                    rule = decide_kv(size, L, mbit * 1e6 / 8, cost)
                    faster = "ship" if s_ms <= r_ms else "re-prefill"
                    chose = "ship" if rule.ship else "re-prefill"
                    right += chose == faster
                    total += 1
                    print(f"{shaped[:28]:>28} {L:>6} {size / 1e6:>7.1f} {s_ms:>9.1f} {r_ms:>14.1f} {faster:>11} "
                          f"{chose:>11}", flush=True)
            finally:
                sender.close()
    print(f"the rule chose the faster way in {right} of {total} cases")


if __name__ == "__main__":
    main()
