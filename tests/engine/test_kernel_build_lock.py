"""A build killed midway leaves torch's `lock` file in the build folder, and torch makes
every later process wait on it forever: a worker killed during its first start would
hang every worker after it. The native ops clear it under a lock of their own."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from native_builds import load
from shoal.nodes.worker.kernels import build_name, default_isa

pytestmark = pytest.mark.timeout(300)


def test_a_lock_left_by_a_killed_build_does_not_hang_the_next_process():
    from torch.utils.cpp_extension import _get_build_directory

    isa = default_isa()
    load(isa)  # built (or loaded) here first: the child then only has to get past the lock
    lock = Path(_get_build_directory(build_name(isa), verbose=False)) / "lock"
    lock.touch()  # what a build killed between taking and releasing it leaves
    child = textwrap.dedent(f"""
        import logging; logging.basicConfig(level=logging.INFO)
        from shoal.nodes.worker.kernels import native_ops
        assert native_ops({isa!r}) is not None
    """)
    try:
        done = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=180)
    except subprocess.TimeoutExpired:
        pytest.fail("a process waited on the stale build lock")
    finally:
        lock.unlink(missing_ok=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "left by a build that was killed" in done.stderr
