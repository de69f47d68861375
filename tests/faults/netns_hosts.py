"""Several "hosts" on one machine: network namespaces joined by an emulated switch in
this one (`scripts/link_emulator.py`: TAP devices, so that links can be delayed, lossy
and rate-limited on kernels without netem).

This namespace holds the gateway's address (etcd and the test's client live here); each
host is a namespace with one interface on the switch and an address of its own, and
runs its nodes by `cluster-up` under `ip netns exec`. A host's link can be shaped (rate,
one-way delay, loss, both ways), cut and healed. Needs root and iproute2 (tests marked
`netns`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

EMULATOR = Path(__file__).resolve().parents[2] / "scripts" / "link_emulator.py"


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True)


class NetnsHosts:
    def __init__(self, count: int, tag: str | None = None):
        self.count = count
        self.tag = tag or f"{os.getpid() % 10000}"
        self.net = os.getpid() % 200 + 20  # a /24 of its own per test process
        self.gateway_device = f"shg{self.tag}"[:15]
        self.gateway = f"10.214.{self.net}.1"
        self.switch: subprocess.Popen | None = None

    def ns(self, k: int) -> str:
        return f"shoal-{self.tag}-h{k}"

    def address(self, k: int) -> str:
        return f"10.214.{self.net}.{10 + k}"

    def prefix(self, k: int) -> list[str]:
        """What runs a command on host k."""
        return ["ip", "netns", "exec", self.ns(k)]

    def create(self) -> "NetnsHosts":
        self.destroy()  # leftovers of a killed run
        for k in range(1, self.count + 1):
            _ip("netns", "add", self.ns(k))
        hosts = [a for k in range(1, self.count + 1) for a in ("--host", f"{self.ns(k)}={self.address(k)}/24")]
        self.switch = subprocess.Popen([sys.executable, str(EMULATOR), "--gateway", f"{self.gateway_device}={self.gateway}/24",
                                        "--tag", self.tag, *hosts],
                                       stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        ready = self.switch.stdout.readline().strip()
        if ready != "ready":
            raise RuntimeError(f"the link emulator did not start (exit {self.switch.wait(10)})")
        return self

    def _command(self, line: str) -> str:
        self.switch.stdin.write(line + "\n")
        self.switch.stdin.flush()
        answer = self.switch.stdout.readline().strip()
        if not answer.startswith("ok"):
            raise RuntimeError(f"link emulator: {line!r}: {answer}")
        return answer[2:].strip()

    def shape(self, k: int, rate_mbit: int, delay_ms: float = 0.0, loss_pct: float = 0.0) -> str:
        """Shapes host k's link both ways; returns what was applied."""
        self._command(f"shape {self.ns(k)} {rate_mbit} {delay_ms} {loss_pct}")
        return f"{rate_mbit} Mbit/s, {delay_ms} ms each way, {loss_pct}% loss each way (emulated switch)"

    def cut(self, k: int) -> None:
        """Every frame to and from host k is lost until `heal` (its interface stays up,
        as when a cable or a switch port fails)."""
        self._command(f"cut {self.ns(k)}")

    def heal(self, k: int) -> None:
        self._command(f"heal {self.ns(k)}")

    def stats(self) -> dict:
        return json.loads(self._command("stats"))

    def destroy(self) -> None:
        if self.switch is not None:
            self.switch.stdin.close()  # the emulator exits; its TAP devices go with it
            try:
                self.switch.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.switch.kill()
                self.switch.wait()
            self.switch = None
        for k in range(1, self.count + 1):
            subprocess.run(["ip", "netns", "del", self.ns(k)], capture_output=True)
        subprocess.run(["ip", "link", "del", self.gateway_device], capture_output=True)

    def __enter__(self) -> "NetnsHosts":
        return self.create()

    def __exit__(self, *exc) -> None:
        self.destroy()
