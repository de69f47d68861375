"""The user-space link emulator's timing, loss and switching (pipes stand in for TAP
devices; the netns tests run it on real ones)."""

from __future__ import annotations

import os
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
from link_emulator import QUEUE_S, Direction, Port, Switch  # noqa: E402


def frame(dst: bytes, src: bytes, size: int = 1000) -> bytes:
    return dst + src + b"\x08\x00" + b"x" * (size - 14)


def test_a_direction_serializes_at_its_rate_then_delays():
    d = Direction(rate_bps=8e6, delay_s=0.005)  # 1 MB/s: 1000 bytes take 1 ms
    rng = random.Random(0)
    assert d.admit(10.0, 1000, rng) == 10.0 + 0.001 + 0.005
    assert abs(d.admit(10.0, 1000, rng) - (10.0 + 0.002 + 0.005)) < 1e-12  # queued behind the first
    assert d.admit(20.0, 1000, rng) == 20.0 + 0.001 + 0.005  # an idle link starts at once


def test_a_full_queue_drops_at_its_tail_and_loss_follows_its_rate():
    d = Direction(rate_bps=8e6)
    rng = random.Random(0)
    arrivals = [d.admit(0.0, 12_000, rng) for _ in range(40)]  # 12 ms each: past QUEUE_S the rest are dropped
    kept = [a for a in arrivals if a is not None]
    assert len(kept) == int(QUEUE_S / 0.012) + 1 and arrivals[len(kept):] == [None] * (40 - len(kept))
    lossy = Direction(loss=0.2)
    lost = sum(lossy.admit(0.0, 100, rng) is None for _ in range(10_000))
    assert 1700 < lost < 2300


def test_the_switch_learns_floods_and_delivers_in_time_order():
    pipes = [os.pipe() for _ in range(3)]
    ports = [Port(f"p{k}", w) for k, (_, w) in enumerate(pipes)]
    for p in ports:
        os.set_blocking(p.fd, False)
    sw = Switch(ports)
    ports[0].shape(0, 10, 0)  # p0's link: 10 ms each way
    a, b = b"\x02" + b"\xaa" * 5, b"\x02" + b"\xbb" * 5  # unicast MACs (the group bit clear)
    sw.receive(ports[1], frame(b"\xff" * 6, b), now=0.0)  # broadcast from p1: p0 and p2 get it
    sw.run_due(0.0)
    sw.run_due(0.0)
    assert os.read(pipes[2][0], 4096)[6:12] == b  # p2's link is unshaped: at once
    sw.run_due(0.009)
    assert sw.next_due() is not None  # p0's copy still on its down direction
    sw.run_due(0.0101)
    assert os.read(pipes[0][0], 4096)[6:12] == b
    sw.receive(ports[0], frame(b, a), now=1.0)  # to b's learned port only, after p0's up delay
    sw.run_due(1.0101)
    sw.run_due(1.0101)
    assert os.read(pipes[1][0], 4096)[:6] == b
    os.set_blocking(pipes[2][0], False)
    try:
        os.read(pipes[2][0], 4096)
        raise AssertionError("a unicast frame was flooded")
    except BlockingIOError:
        pass
    sw.command("cut p1")
    sw.receive(ports[0], frame(b, a), now=2.0)
    sw.run_due(3.0)
    sw.run_due(3.0)
    assert ports[1].dropped == 1 and sw.next_due() is None
    assert sw.command("heal p1") == "ok" and not ports[1].cut
    assert sw.command("shape nowhere 1 1 1").startswith("error: no port")
    assert sw.command("shape p1 1 x 0").startswith("error: shape needs numbers")  # answered, not fatal
    for r, w in pipes:
        os.close(r)
        os.close(w)
