"""A second network host on this machine, for partition tests: a network namespace
joined to this one by a veth pair. Processes started with `prefix` live on it; `cut()`
takes the link down (established TCP connections stall, new ones time out: a real
partition, not a closed socket) and `heal()` brings it back.

Needs CAP_NET_ADMIN and iproute2 (`ip`), which this project's machines and CI have.
"""

from __future__ import annotations

import os
import subprocess


def _ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"`ip {' '.join(args)}` failed: {done.stderr.strip()} (network namespaces need "
                           "root or CAP_NET_ADMIN; without them deselect these tests with -m 'not netns')")


class NetnsHost:
    def __init__(self, tag: str | None = None):
        n = os.getpid() % 200 + 20  # a /30 of its own per test process
        tag = tag or f"{os.getpid() % 100000}"
        self.ns = f"shoal-{tag}"
        self.outer_if, self.inner_if = f"sho{tag}"[:15], f"shi{tag}"[:15]
        self.outer_ip, self.inner_ip = f"10.213.{n}.1", f"10.213.{n}.2"

    @property
    def prefix(self) -> list[str]:
        return ["ip", "netns", "exec", self.ns]

    def create(self) -> "NetnsHost":
        self.destroy()  # leftovers of a killed run
        _ip("netns", "add", self.ns)
        _ip("link", "add", self.outer_if, "type", "veth", "peer", "name", self.inner_if)
        _ip("link", "set", self.inner_if, "netns", self.ns)
        _ip("addr", "add", f"{self.outer_ip}/30", "dev", self.outer_if)
        _ip("link", "set", self.outer_if, "up")
        for args in (("addr", "add", f"{self.inner_ip}/30", "dev", self.inner_if),
                     ("link", "set", self.inner_if, "up"), ("link", "set", "lo", "up")):
            _ip("-n", self.ns, *args)
        return self

    def cut(self) -> None:
        _ip("link", "set", self.outer_if, "down")

    def heal(self) -> None:
        _ip("link", "set", self.outer_if, "up")

    def destroy(self) -> None:
        subprocess.run(["ip", "link", "del", self.outer_if], capture_output=True)
        subprocess.run(["ip", "netns", "del", self.ns], capture_output=True)

    def __enter__(self) -> "NetnsHost":
        return self.create()

    def __exit__(self, *exc) -> None:
        self.destroy()
