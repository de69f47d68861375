"""A network of hosts with slow, delayed, lossy links, emulated in user space: a switch
whose ports are TAP devices, one in each host's network namespace and one here.

Kernels without netem (it is a module many minimal kernels leave out) cannot add delay
or loss to a link; tbf alone limits its rate. This switch does all three to every frame
that crosses it, so the kernels' own TCP stacks at both ends see real queueing, delay,
loss and retransmission. Each host's link has two directions, up (host to switch) and
down (switch to host), each with the link's rate, one-way delay and loss; a frame from
host a to host b crosses a's up and b's down, as through two netem'd links and a bridge.
A direction's queue holds at most QUEUE_S seconds of its rate; past that, frames are
dropped at its tail, as a router's buffer would. Frames are switched by destination MAC
(learned from sources; unknown and broadcast ones are flooded).

    link_emulator.py --gateway shg1=10.214.5.1/24 --host ns-a=10.214.5.11/24 --host ns-b=10.214.5.12/24

makes the TAP devices (the gateway one here, one named eth0 in each namespace), prints
`ready`, and then takes commands on stdin, one per line, answering each with `ok`:

    shape PORT RATE_MBIT DELAY_MS LOSS_PCT    (RATE_MBIT 0: no limit)
    cut PORT    heal PORT    stats

PORT is a host's namespace or the gateway's device name. It exits when stdin closes;
its TAP devices go with it. Needs root (CAP_NET_ADMIN) and iproute2.
"""

from __future__ import annotations

import argparse
import errno
import fcntl
import heapq
import json
import math
import os
import random
import select
import struct
import subprocess
import sys
import time
from dataclasses import dataclass, field

TUNSETIFF, IFF_TAP, IFF_NO_PI = 0x400454CA, 0x0002, 0x1000
MTU = 16000  # large frames: a Python switch pays per frame, not per byte
QUEUE_S = 0.2  # a direction's buffer, in seconds of its rate
BROADCAST_BIT = 0x01  # the group bit of a MAC's first byte


@dataclass
class Direction:
    """One direction of a link: a FIFO queue drained at `rate_bps`, then `delay_s` of
    propagation; each frame lost with probability `loss`."""

    rate_bps: float = 0.0  # 0: no limit
    delay_s: float = 0.0
    loss: float = 0.0
    free_at: float = 0.0  # when the frames queued so far will have left

    def admit(self, now: float, size: int, rng: random.Random) -> float | None:
        """When a frame of `size` bytes offered at `now` arrives at the far end, or None
        when it is lost or finds the queue full."""
        if self.loss and rng.random() < self.loss:
            return None
        start = max(now, self.free_at)
        if self.rate_bps:
            if start - now > QUEUE_S:
                return None
            self.free_at = start + size * 8 / self.rate_bps
        else:
            self.free_at = start
        return self.free_at + self.delay_s


@dataclass
class Port:
    name: str
    fd: int
    up: Direction = field(default_factory=Direction)  # from the host into the switch
    down: Direction = field(default_factory=Direction)  # from the switch to the host
    cut: bool = False
    frames_in: int = 0
    frames_out: int = 0
    dropped: int = 0

    def shape(self, rate_mbit: float, delay_ms: float, loss_pct: float) -> None:
        for d in (self.up, self.down):
            d.rate_bps, d.delay_s, d.loss = rate_mbit * 1e6, delay_ms / 1e3, loss_pct / 100


class Switch:
    """Frames between ports, through each link's two directions, in time order."""

    def __init__(self, ports: list[Port], seed: int = 0):
        self.ports = {p.name: p for p in ports}
        self.by_fd = {p.fd: p for p in ports}
        self.macs: dict[bytes, Port] = {}
        self.events: list = []  # (due, order, stage, port, frame)
        self.order = 0
        self.rng = random.Random(seed)

    def _push(self, due: float, stage: str, port: Port, frame: bytes) -> None:
        self.order += 1
        heapq.heappush(self.events, (due, self.order, stage, port, frame))

    def receive(self, port: Port, frame: bytes, now: float) -> None:
        """A frame the host behind `port` sent: it crosses the link's up direction."""
        port.frames_in += 1
        if len(frame) < 14:
            return
        self.macs[frame[6:12]] = port
        due = None if port.cut else port.up.admit(now, len(frame), self.rng)
        if due is None:
            port.dropped += 1
            return
        self._push(due, "switch", port, frame)

    def _switch(self, source: Port, frame: bytes, now: float) -> None:
        dest = frame[0:6]
        known = None if dest[0] & BROADCAST_BIT else self.macs.get(dest)
        for port in [known] if known is not None else self.ports.values():
            if port is source:
                continue
            due = None if port.cut else port.down.admit(now, len(frame), self.rng)
            if due is None:
                port.dropped += 1
                continue
            self._push(due, "deliver", port, frame)

    def run_due(self, now: float) -> None:
        while self.events and self.events[0][0] <= now:
            due, _, stage, port, frame = heapq.heappop(self.events)
            if stage == "switch":
                self._switch(port, frame, due)
                continue
            try:
                os.write(port.fd, frame)
                port.frames_out += 1
            except OSError as e:  # the host's queue is full or its device gone: lost
                if e.errno not in (errno.EAGAIN, errno.EIO, errno.EBADFD):
                    raise
                port.dropped += 1

    def next_due(self) -> float | None:
        return self.events[0][0] if self.events else None

    def command(self, line: str) -> str:
        words = line.split()
        if not words:
            return "ok"
        if words[0] == "stats":
            return "ok " + json.dumps({p.name: {"in": p.frames_in, "out": p.frames_out, "dropped": p.dropped,
                                                "cut": p.cut} for p in self.ports.values()})
        port = self.ports.get(words[1]) if len(words) > 1 else None
        if port is None:
            return f"error: no port {words[1] if len(words) > 1 else ''!r} (ports: {', '.join(self.ports)})"
        if words[0] == "shape" and len(words) == 5:
            try:
                rate, delay, loss = (float(w) for w in words[2:])
            except ValueError:
                return f"error: shape needs numbers: {line.strip()!r}"
            port.shape(rate, delay, loss)
        elif words[0] in ("cut", "heal"):
            port.cut = words[0] == "cut"
        else:
            return f"error: unknown command {line.strip()!r}"
        return "ok"


def open_tap(name: str) -> int:
    fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK)
    fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH", name.encode(), IFF_TAP | IFF_NO_PI))
    return fd


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


def make_ports(gateway: str, hosts: list[str], tag: str) -> list[Port]:
    """The gateway's TAP here and each host's, moved into its namespace as eth0 (the
    device keeps its file descriptor across the move)."""
    name, cidr = gateway.split("=")
    fd = open_tap(name)
    ip("link", "set", name, "mtu", str(MTU))
    ip("addr", "add", cidr, "dev", name)
    ip("link", "set", name, "up")
    ports = [Port(name, fd)]
    for k, spec in enumerate(hosts):
        ns, cidr = spec.split("=")
        tap = f"sht{tag}{k}"[:15]
        fd = open_tap(tap)
        ip("link", "set", tap, "netns", ns)
        ip("-n", ns, "link", "set", tap, "name", "eth0", "mtu", str(MTU))
        ip("-n", ns, "addr", "add", cidr, "dev", "eth0")
        ip("-n", ns, "link", "set", "eth0", "up")
        ip("-n", ns, "link", "set", "lo", "up")
        ports.append(Port(ns, fd))
    return ports


def serve(switch: Switch) -> None:
    poller = select.poll()
    stdin = sys.stdin.fileno()  # read with os.read after poll says so: blocking mode stays (a terminal's
    # stdin and stdout are one file, and non-blocking would break the answers printed on it)
    poller.register(stdin, select.POLLIN)
    for fd in switch.by_fd:
        poller.register(fd, select.POLLIN)
    pending = b""
    while True:
        due = switch.next_due()
        # poll waits whole milliseconds, rounding up: wait the whole ones and spin the rest, so that
        # a frame is not delivered up to a millisecond late.
        wait_ms = 200 if due is None else min(200, max(0, math.floor((due - time.monotonic()) * 1000)))
        for fd, _ in poller.poll(wait_ms):
            if fd == stdin:
                data = os.read(stdin, 4096)
                if not data:
                    return
                pending += data
                while b"\n" in pending:
                    line, pending = pending.split(b"\n", 1)
                    print(switch.command(line.decode()), flush=True)
                continue
            port, now = switch.by_fd.get(fd), time.monotonic()
            if port is None:
                continue
            for _ in range(64):  # bounded, so one busy port cannot starve the others
                try:
                    frame = os.read(fd, MTU + 64)
                except BlockingIOError:
                    break
                except OSError as e:  # its device is gone (the namespace deleted): the port with it
                    print(f"port {port.name} closed: {e}", file=sys.stderr, flush=True)
                    poller.unregister(fd)
                    del switch.by_fd[fd]
                    port.cut = True
                    break
                switch.receive(port, frame, now)
        switch.run_due(time.monotonic())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gateway", required=True, help="DEVICE=ADDRESS/PREFIX: the TAP in this namespace")
    ap.add_argument("--host", action="append", default=[], help="NAMESPACE=ADDRESS/PREFIX (repeat)")
    ap.add_argument("--tag", default=str(os.getpid() % 10000), help="makes the temporary device names unique")
    ap.add_argument("--seed", type=int, default=0, help="the loss draws' seed")
    args = ap.parse_args()
    switch = Switch(make_ports(args.gateway, args.host, args.tag), seed=args.seed)
    print("ready", flush=True)
    serve(switch)


if __name__ == "__main__":
    main()
