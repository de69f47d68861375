"""The Triton kernels compiled for real GPUs, on a machine without one.

The interpreter (`test_ops_backends.py`) checks what the kernels compute, but it never
compiles them, and it runs the bf16 products widened to fp32: the branches a GPU takes
are never built there. Triton's NVIDIA backend and the `ptxas` its wheel carries compile
for a named target without a GPU, so every kernel is compiled here, as far as machine
code, at specializations the engine launches (`CASES`; in a child process,
`triton_compile_probe.py`, since this one may have the interpreter on). A compile error
the interpreter cannot see fails here, and so does an attention tile that the GPU named
cannot run for want of shared memory: Hopper (H100 / H200, sm_90, 227 KB a block) must
take the preferred tile; on Ada (L4, sm_89, 99 KB) the preferred fp32 tile, and the bf16
tile of a 256-wide head, do not fit, and the fallback to smaller ones
(`tile_candidates`) must find one that does. (A compile takes 1-10 s on a CPU, fp32 the
longest, so the list is short.)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton", reason="Triton is a dev dependency (pyproject's dev extra)")

PROBE = Path(__file__).with_name("triton_compile_probe.py")
SHARED_LIMIT = {90: 232448, 89: 101376}  # bytes a block may opt in to

# (target, dtype, group, head dim, rows of the longest span): the main path's tiles on
# Hopper (bf16 at three head shapes; fp32, which the greedy check runs, at the preset's),
# and on Ada the two prefill tiles too large for its 99 KB.
CASES = [(90, "bf16", 2, 128, 1), (90, "bf16", 2, 128, 512), (90, "bf16", 7, 128, 512), (90, "bf16", 1, 256, 512),
         (90, "fp32", 2, 128, 1), (90, "fp32", 2, 128, 512), (89, "fp32", 2, 128, 512), (89, "bf16", 1, 256, 512)]
FUSED = [(90, "bf16"), (90, "fp32")]


@pytest.fixture(scope="module")
def compiled():
    """Every job's result, compiled in one child process without the interpreter."""
    jobs = [dict(kind="attention", cap=c, dtype=d, group=g, dim=h, max_len=m) for c, d, g, h, m in CASES]
    jobs += [dict(kind="fused", cap=c, dtype=d) for c, d in FUSED]
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, str(PROBE)], input=json.dumps(jobs), capture_output=True, text=True,
                          env=env, timeout=280)
    assert done.returncode == 0, f"the compile probe failed:\n{done.stderr[-3000:]}"
    results = json.loads(done.stdout.strip().splitlines()[-1])
    return {**dict(zip(CASES, results[:len(CASES)])), **dict(zip(FUSED, results[len(CASES):]))}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("case", CASES, ids=["-".join(map(str, c)) for c in CASES])
def test_the_attention_kernel_compiles_and_fits_the_gpu(compiled, case):
    cap, dtype, group, dim, max_len = case
    where = f"sm_{cap}, {dtype}, group {group}, head dim {dim}, {'decode' if max_len == 1 else 'prefill'}"
    result = compiled[case]
    assert "error" not in result, f"{where}: {result.get('error')}\n{result.get('traceback', '')}"
    tried = result["tried"]
    assert all(cubin for *_, cubin in tried), f"{where}: no machine code came out of ptxas"
    assert tried[-1][2] <= SHARED_LIMIT[cap], f"{where}: no tile fits {SHARED_LIMIT[cap]} bytes: {tried}"
    if cap == 90:
        assert len(tried) == 1, f"{where}: the preferred tile needs {tried[0][2]} bytes of shared memory"
    else:  # the fallback is needed here, and it finds a tile
        assert len(tried) > 1, f"{where}: expected the preferred tile not to fit 99 KB: {tried}"


@pytest.mark.parametrize("case", FUSED, ids=["-".join(map(str, c)) for c in FUSED])
def test_the_fused_elementwise_kernels_compile_for_hopper(compiled, case):
    result = compiled[case]
    assert "error" not in result, f"{case}: {result.get('error')}\n{result.get('traceback', '')}"
    for name, shared, cubin in result["kernels"]:
        assert cubin and shared <= SHARED_LIMIT[90], f"{name} ({case}): {shared} bytes, machine code {cubin}"


def test_the_tile_fallback_ends_at_16_query_vectors():
    from shoal.nodes.worker.kernels import triton_attention

    assert triton_attention.tile_candidates(32, 64, 2) == [(32, 64), (32, 32), (32, 16), (16, 16), (8, 16)]
    assert triton_attention.tile_candidates(8, 64, 2)[-1] == (8, 16)  # a decode tile: already 16 vectors
    assert triton_attention.tile_candidates(1, 64, 16) == [(1, 64), (1, 32), (1, 16)]


def test_a_tile_refused_for_shared_memory_is_retried_smaller_and_remembered(monkeypatch):
    """The launcher's fallback, with a stand-in for the compiled kernel that refuses tiles
    as Triton does on a GPU with too little shared memory (before anything runs)."""
    import torch
    from triton.runtime.errors import OutOfResources

    from shoal.nodes.worker.kernels import triton_attention

    launched = []

    class Refusing:
        def __getitem__(self, grid):
            def launch(*args, BLOCK_M, BLOCK_N, **constants):
                launched.append((BLOCK_M, BLOCK_N))
                if BLOCK_M * BLOCK_N > 32 * 16:
                    raise OutOfResources(BLOCK_M * BLOCK_N * 256, 32 * 16 * 256, "shared memory")
            return launch

    monkeypatch.setattr(triton_attention, "_paged_attention_kernel", Refusing())
    monkeypatch.setattr(triton_attention, "_fitting_tile", {})
    q = torch.zeros(40, 4, 16)
    cache = torch.zeros(64, 2, 16)
    one = torch.zeros(1, dtype=torch.long)
    args = (q, cache, cache, torch.zeros(1, 4, dtype=torch.long), one, one + 40, one + 40, 16, 0.25, torch.zeros_like(q), 40)
    triton_attention.paged_attention(*args)
    assert launched == [(32, 64), (32, 32), (32, 16)]
    launched.clear()
    triton_attention.paged_attention(*args)
    assert launched == [(32, 16)], "the tile that fitted was not remembered"

    def refuse_all(*args, **constants):
        raise OutOfResources(1, 0, "shared memory")
    monkeypatch.setattr(triton_attention, "_paged_attention_kernel", type("R", (), {"__getitem__": lambda s, g: refuse_all})())
    monkeypatch.setattr(triton_attention, "_fitting_tile", {})
    with pytest.raises(OutOfResources):
        triton_attention.paged_attention(*args)
