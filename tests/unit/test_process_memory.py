"""A control-plane node maps message-sized buffers apart (`nodes/process_memory.py`):
after glibc has freed one mapped 4 MiB buffer it would serve the next from the heap,
where a small object allocated after it pins the heap's top; mapped apart, each freed
buffer is unmapped. Each side runs in a fresh interpreter (the setting is for good)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.timeout(60)

CHILD = textwrap.dedent("""
    import sys
    from shoal.nodes.process_memory import map_large_buffers_apart

    def rss_mib():
        return int(open("/proc/self/statm").read().split()[1]) * 4096 / 2**20

    if sys.argv[1] == "apart":
        map_large_buffers_apart()
    keep, before = [], rss_mib()
    for _ in range(30):
        chunk = bytearray(4 << 20)  # an upload chunk, as received
        chunk[::4096] = b"x" * (len(chunk) // 4096)
        keep.append(bytearray(300))  # something small that outlives it
        del chunk
    print(rss_mib() - before)
""")


def grown_mib(mode: str) -> float:
    done = subprocess.run([sys.executable, "-c", CHILD, mode], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr[-2000:]
    return float(done.stdout.strip())


def test_freed_large_buffers_go_back_when_mapped_apart():
    apart, default = grown_mib("apart"), grown_mib("default")
    assert apart < 1.0, f"RSS grew {apart:.1f} MiB over 30 freed 4 MiB buffers mapped apart"
    assert default >= 3.0, f"glibc's default kept {default:.1f} MiB: this check no longer shows the difference"


def test_startup_heap_is_frozen_out_of_full_collections():
    """What is alive when a node is up leaves the collector's generations (a full
    collection no longer walks it); what comes later is still collected."""
    code = textwrap.dedent("""
        import gc
        from shoal.nodes.process_memory import freeze_startup_heap
        startup = [[i] for i in range(50_000)]
        assert gc.get_freeze_count() == 0
        freeze_startup_heap()
        frozen = gc.get_freeze_count()
        assert frozen >= 50_000, frozen
        tracked = len(gc.get_objects())
        assert tracked < frozen, (tracked, frozen)  # the startup objects are not in any generation
        class Cycle: pass
        a, b = Cycle(), Cycle(); a.b, b.a = b, a
        del a, b
        assert gc.collect() >= 2  # later garbage in cycles is still found
        print("ok")
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def test_heap_frozen_while_work_runs_and_given_back_after():
    """In-process work: what is alive at its start is out of the collector's generations
    while it runs and back after (so that a cycle dropped later is still collected); a
    heap frozen already (a node's) is left as it is."""
    code = textwrap.dedent("""
        import gc
        from shoal.nodes.process_memory import heap_frozen_while
        class Cycle: pass
        a, b = Cycle(), Cycle(); a.b, b.a = b, a
        alive = [[i] for i in range(20_000)]
        with heap_frozen_while():
            assert gc.get_freeze_count() >= 20_000
            with heap_frozen_while():  # within: nothing more
                inner = gc.get_freeze_count()
            assert gc.get_freeze_count() == inner
            c, d = Cycle(), Cycle(); c.d, d.c = d, c
            del c, d
            assert gc.collect() >= 2  # garbage made during the work is collected
        assert gc.get_freeze_count() == 0
        del a, b  # alive at the start, dropped after: collected, not kept frozen for good
        assert gc.collect() >= 2
        gc.freeze()
        n = gc.get_freeze_count()
        with heap_frozen_while():
            pass
        assert gc.get_freeze_count() == n  # a node's frozen heap is not unfrozen
        print("ok")
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
