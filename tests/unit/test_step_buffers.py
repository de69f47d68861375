"""malloc keeps a step's large tensors between steps; pieces of rows stay under its threshold."""

from __future__ import annotations

import subprocess
import sys

import pytest

from shoal.nodes.worker.step_buffers import LARGEST_STEP_TENSOR, MMAP_THRESHOLD_MAX, chunk_rows

pytestmark = pytest.mark.timeout(60)

# A "step" of buffers alive at once, then freed, five times over (after three to warm
# up), on the main thread or another: the minor page faults of one step. No torch:
# malloc itself.
STEPS = r"""
import ctypes, resource, sys, threading
from shoal.nodes.worker.step_buffers import keep_step_buffers
if sys.argv[1] == "keep":
    assert keep_step_buffers()
libc = ctypes.CDLL(None)
libc.malloc.restype, libc.malloc.argtypes, libc.free.argtypes = ctypes.c_void_p, [ctypes.c_size_t], [ctypes.c_void_p]

sizes = [int(mib) << 20 for mib in sys.argv[3].split(",")]

def step():
    held = [libc.malloc(n) for n in sizes]
    for p, n in zip(held, sizes):
        ctypes.memset(p, 1, n)
    for p in held:
        libc.free(p)

def steps():
    for _ in range(3):
        step()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(5):
        step()
    print((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 5)

if sys.argv[2] == "main":
    steps()
else:
    t = threading.Thread(target=steps)
    t.start()
    t.join()
"""


def faults_per_step(mode: str, thread: str, sizes: str) -> float:
    out = subprocess.run([sys.executable, "-c", STEPS, mode, thread, sizes], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    return float(out.stdout)


@pytest.mark.parametrize("thread, sizes", [("main", "20,20,20"), ("other", "20,20,20"), ("other", "16,16,10,6,6,16")])
def test_kept_buffers_are_not_faulted_in_again(thread, sizes):
    # glibc's defaults fault thousands of pages in again every step (the main thread's
    # trimmed heap; another thread's emptied heaps, unmapped); kept, a step touches
    # only memory it had.
    assert faults_per_step("default", thread, sizes) > 2000
    assert faults_per_step("keep", thread, sizes) < 100


def test_rows_fit_whole_when_small_enough():
    assert chunk_rows(100, 1024) == 100
    assert chunk_rows(2048, LARGEST_STEP_TENSOR // 2048) == 2048


@pytest.mark.parametrize("rows, row_bytes", [(4096, 8192), (4096, 16384), (3000, 8192), (4097, 8192), (7, 1 << 30)])
def test_pieces_are_equal_under_the_limit_and_cover_every_row(rows, row_bytes):
    piece = chunk_rows(rows, row_bytes)
    assert 1 <= piece <= rows
    assert piece * row_bytes <= LARGEST_STEP_TENSOR or piece == 1  # a single row is never split
    pieces = -(-rows // piece)
    assert pieces * piece >= rows and (pieces - 1) * piece < rows
    assert rows - (pieces - 1) * piece > piece // 2 or pieces == 1 or piece == 1  # equal pieces, no sliver


def test_w3_prefill_step_splits_in_two():
    # 4,096 tokens of W1/W3's MLP (2 x 2,048 bf16 gate and up columns): 32 MiB, glibc's
    # ceiling, so two pieces of 2,048 rows.
    assert chunk_rows(4096, 2 * 2048 * 2) == 2048
    assert LARGEST_STEP_TENSOR < MMAP_THRESHOLD_MAX
