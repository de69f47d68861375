"""Nothing open by accident: metrics listen on loopback unless told otherwise, and
beyond it only where the node's own ports may; nodes start in Python's safe-path mode,
so a `shoal/` folder where they are started never shadows the installed package."""

from __future__ import annotations

import subprocess
import sys

import pytest

from shoal.nodes.node import node_arg_parser, parse_node_args


def test_metrics_default_to_loopback_and_go_beyond_it_only_as_the_node_may(monkeypatch):
    monkeypatch.delenv("SHOAL_CURVE_KEYS", raising=False)
    args = parse_node_args(node_arg_parser("router"), ["--metrics-port", "9100"])
    assert args.metrics_host == "127.0.0.1"
    with pytest.raises(SystemExit):  # plain HTTP on every interface, with no keys and no --insecure
        parse_node_args(node_arg_parser("router"), ["--metrics-port", "9100", "--metrics-host", "0.0.0.0"])
    args = parse_node_args(node_arg_parser("router"), ["--metrics-port", "9100", "--metrics-host", "0.0.0.0",
                                                       "--insecure"])
    assert args.metrics_host == "0.0.0.0"


def test_nodes_start_in_safe_path_mode(tmp_path, monkeypatch):
    from shoal.cluster import node_process

    seen = {}

    class Stop(Exception):
        pass

    def popen(cmd, **kw):
        seen["cmd"] = cmd
        raise Stop

    monkeypatch.setattr(node_process.subprocess, "Popen", popen)
    with pytest.raises(Stop):
        node_process.spawn_node("storage", "storage-0", [], tmp_path / "logs")
    monkeypatch.undo()  # (subprocess.Popen is the module's own again)
    interpreter = seen["cmd"][:2]
    assert interpreter == [sys.executable, "-P"]
    # The same interpreter flags, run from a folder holding a `shoal/` that would break
    # any import of the package: the installed package is the one that loads.
    (tmp_path / "shoal").mkdir()
    (tmp_path / "shoal" / "__init__.py").write_text("raise SystemExit('the shadowing folder was imported')\n")
    ok = subprocess.run([*interpreter, "-c", "import shoal.protocol.version"], cwd=tmp_path, capture_output=True,
                        text=True, timeout=60)
    assert ok.returncode == 0, ok.stderr
    shadowed = subprocess.run([sys.executable, "-m", "shoal.protocol.version"], cwd=tmp_path, capture_output=True,
                              text=True, timeout=60)
    assert "shadowing folder" in shadowed.stderr  # what -P prevents


def test_a_node_that_never_prints_its_address_is_killed_at_the_timeout(tmp_path):
    """A worker prints its address once its models are loaded and calibrated: one that
    hangs there is killed when the start's time runs out, and the error names its log."""
    import time

    from shoal.cluster import node_process

    t = time.monotonic()
    with pytest.raises(RuntimeError, match=r"worker-0 did not start within 1 s: killed.*worker-0\.log"):
        # The node's command is given to a shell that only sleeps: no address ever comes.
        node_process.spawn_node("worker", "worker-0", [], tmp_path / "logs", prefix=["sh", "-c", "sleep 59.7", "--"],
                                timeout=1)
    assert time.monotonic() - t < 10
    from pathlib import Path

    left = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if cmdline.read_bytes() == b"sleep\x0059.7\x00":
                left.append(cmdline.parent.name)
        except OSError:
            pass  # (a process that ended meanwhile)
    assert not left, f"the hung node was left running: pids {left}"
