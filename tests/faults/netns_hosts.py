"""Several "hosts" on one machine: network namespaces joined by a bridge in this one.

This namespace holds the bridge's address (etcd and the test's client live here); each
host is a namespace with one interface on the bridge and an address of its own, and
runs its nodes by `cluster-up` under `ip netns exec`. A host's link can be shaped (a
bandwidth limit, and delay and loss where the kernel has netem), cut and healed.
Needs root and iproute2 (tests marked `netns`).
"""

from __future__ import annotations

import os
import subprocess


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True)


def _tc(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["tc", *args], capture_output=True, text=True)


class NetnsHosts:
    def __init__(self, count: int, tag: str | None = None):
        self.count = count
        self.tag = tag or f"{os.getpid() % 10000}"
        self.net = os.getpid() % 200 + 20  # a /24 of its own per test process
        self.bridge = f"shb{self.tag}"[:15]
        self.gateway = f"10.214.{self.net}.1"

    def ns(self, k: int) -> str:
        return f"shoal-{self.tag}-h{k}"

    def veth(self, k: int) -> str:
        return f"shv{self.tag}h{k}"[:15]

    def address(self, k: int) -> str:
        return f"10.214.{self.net}.{10 + k}"

    def prefix(self, k: int) -> list[str]:
        """What runs a command on host k."""
        return ["ip", "netns", "exec", self.ns(k)]

    def create(self) -> "NetnsHosts":
        self.destroy()  # leftovers of a killed run
        _ip("link", "add", self.bridge, "type", "bridge")
        _ip("addr", "add", f"{self.gateway}/24", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        for k in range(1, self.count + 1):
            _ip("netns", "add", self.ns(k))
            _ip("link", "add", self.veth(k), "type", "veth", "peer", "name", "eth0", "netns", self.ns(k))
            _ip("link", "set", self.veth(k), "master", self.bridge, "up")
            _ip("-n", self.ns(k), "addr", "add", f"{self.address(k)}/24", "dev", "eth0")
            _ip("-n", self.ns(k), "link", "set", "eth0", "up")
            _ip("-n", self.ns(k), "link", "set", "lo", "up")
        return self

    def shape(self, k: int, rate_mbit: int, delay_ms: float = 0.0, loss_pct: float = 0.0) -> str:
        """Shapes host k's link both ways; returns what was applied. Delay and loss need
        the kernel's netem; where it is missing only the bandwidth limit (tbf) applies."""
        applied = f"{rate_mbit} Mbit/s"
        for run in ([], self.prefix(k)):
            dev = "eth0" if run else self.veth(k)
            netem = subprocess.run([*run, "tc", "qdisc", "replace", "dev", dev, "root", "netem", "delay", f"{delay_ms}ms",
                                    "loss", f"{loss_pct}%", "rate", f"{rate_mbit}mbit"], capture_output=True, text=True)
            if netem.returncode == 0:
                applied = f"{rate_mbit} Mbit/s, {delay_ms} ms, {loss_pct}% loss (netem)"
                continue
            subprocess.run([*run, "tc", "qdisc", "replace", "dev", dev, "root", "tbf", "rate", f"{rate_mbit}mbit",
                            "burst", "64kb", "latency", "100ms"], check=True, capture_output=True)
            applied = f"{rate_mbit} Mbit/s (tbf; this kernel has no netem: no delay or loss)"
        return applied

    def cut(self, k: int) -> None:
        _ip("link", "set", self.veth(k), "down")

    def heal(self, k: int) -> None:
        _ip("link", "set", self.veth(k), "up")

    def destroy(self) -> None:
        for k in range(1, self.count + 1):
            subprocess.run(["ip", "netns", "del", self.ns(k)], capture_output=True)
            subprocess.run(["ip", "link", "del", self.veth(k)], capture_output=True)
        subprocess.run(["ip", "link", "del", self.bridge], capture_output=True)

    def __enter__(self) -> "NetnsHosts":
        return self.create()

    def __exit__(self, *exc) -> None:
        self.destroy()
