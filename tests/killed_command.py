"""A command run until something is true of its files, then killed with SIGKILL: the
crash a resumable command must survive (no handler runs, buffers are lost)."""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path


def kill_when(args: list[str], ready: Callable[[], bool], timeout: float = 180) -> None:
    cli = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        end = time.monotonic() + timeout
        while not ready():
            assert cli.poll() is None, cli.stderr.read()[-2000:]
            assert time.monotonic() < end, "the command never got there"
            time.sleep(0.05)
        cli.send_signal(signal.SIGKILL)
        cli.wait(timeout=30)
    finally:
        if cli.poll() is None:
            cli.kill()


def whole_lines(path: Path) -> bytes:
    """The file's whole lines: a write the kill cut short leaves a torn one, which a
    rerun cuts off."""
    data = path.read_bytes() if path.exists() else b""
    return data[:data.rfind(b"\n") + 1]
