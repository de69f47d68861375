"""The Triton kernels compiled for real GPUs, on a machine without one.

The interpreter (`test_ops_backends.py`) checks what the kernels compute, but it never
compiles them, and it runs the bf16 products widened to fp32: the branches a GPU takes
are never built there. Triton's NVIDIA backend and the `ptxas` its wheel carries compile
for a named target without a GPU, so here every kernel is compiled, as far as machine
code, at specializations the engine launches (`CASES`). A compile error the interpreter
cannot see fails here, and so does an attention tile that the GPU named cannot run for
want of shared memory: Hopper (H100 / H200, sm_90, 227 KB a block) must take the
preferred tile; Ada (L4, sm_89, 99 KB) shows the fallback to a smaller one
(`tile_candidates`) finding a tile where the preferred fp32 tile does not fit. (Each
compile takes 1-10 s on a CPU, fp32 the longest, so the list is short.)

The signatures carry no alignment hints (the runtime adds them from the tensors it is
given), so the machine code differs from a launch's in vectorization only.
"""

from __future__ import annotations

import pytest

triton = pytest.importorskip("triton", reason="Triton is a dev dependency (pyproject's dev extra)")

from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from shoal.nodes.worker.kernels import triton_attention, triton_fused_ops  # noqa: E402

SHARED_LIMIT = {90: 232448, 89: 101376}  # bytes a block may opt in to
TRITON_TYPE = {"bf16": "*bf16", "fp32": "*fp32"}


def compile_for(fn, cap: int, types: dict[str, str], constants: dict):
    """`fn` compiled for compute capability `cap`: every argument typed by `types` or, for
    the rest, an i32 (sizes and strides) or a constexpr from `constants`."""
    sig = {}
    for name in fn.arg_names:
        sig[name] = "constexpr" if name in constants else types.get(name, "i32")
    return triton.compile(ASTSource(fn, sig, constexprs=constants), target=GPUTarget("cuda", cap, 32))


def attention_types(dtype: str) -> dict[str, str]:
    types = {n: TRITON_TYPE[dtype] for n in ("q_ptr", "k_ptr", "v_ptr", "out_ptr")}
    types.update({n: "*i64" for n in ("table_ptr", "rows_ptr", "lens_ptr", "ctx_ptr")})  # the runner's int64 tensors
    types["scale"] = "fp32"
    return types


def first_fitting_tile(cap: int, dtype: str, group: int, dim: int, max_len: int):
    """The first of `tile_candidates` whose compiled kernel fits the target's shared
    memory, as the launcher would settle on it, with the bytes each tried one needed."""
    g_pad = triton.next_power_of_2(group)
    tried = []
    for block_m, block_n in triton_attention.tile_candidates(triton_attention.tile_rows(max_len, group), 64, g_pad):
        kernel = compile_for(triton_attention._paged_attention_kernel, cap, attention_types(dtype), dict(
            G=group, G_PAD=g_pad, D=dim, D_PAD=max(16, triton.next_power_of_2(dim)), BLOCK_M=block_m,
            BLOCK_N=block_n, IEEE=dtype == "fp32", WIDEN=False))
        assert kernel.asm.get("cubin"), "no machine code came out of ptxas"
        tried.append(((block_m, block_n), kernel.metadata.shared))
        if kernel.metadata.shared <= SHARED_LIMIT[cap]:
            return (block_m, block_n), tried
    return None, tried


# (target, dtype, group, head dim, rows of the longest span): the main path's tiles on
# Hopper (bf16 at three head shapes; fp32, which the greedy check runs, at the preset's),
# and fp32 prefill on Ada, whose preferred tile is too large for 99 KB and falls back.
CASES = [(90, "bf16", 2, 128, 1), (90, "bf16", 2, 128, 512), (90, "bf16", 7, 128, 512), (90, "bf16", 1, 256, 512),
         (90, "fp32", 2, 128, 1), (90, "fp32", 2, 128, 512), (89, "fp32", 2, 128, 512)]


@pytest.mark.parametrize("cap, dtype, group, dim, max_len", CASES)
def test_the_attention_kernel_compiles_and_fits_the_gpu(cap, dtype, group, dim, max_len):
    tile, tried = first_fitting_tile(cap, dtype, group, dim, max_len)
    where = f"sm_{cap}, {dtype}, group {group}, head dim {dim}, {'decode' if max_len == 1 else 'prefill'}"
    assert tile is not None, f"{where}: no tile fits {SHARED_LIMIT[cap]} bytes of shared memory: {tried}"
    if cap == 90:
        assert len(tried) == 1, f"{where}: the preferred tile needs {tried[0][1]} bytes of shared memory"
    if cap == 89:  # the case that shows the fallback is needed, and that it finds a tile
        assert len(tried) > 1, f"{where}: expected the preferred tile not to fit 99 KB: {tried}"


def test_the_tile_fallback_ends_at_16_query_vectors():
    assert triton_attention.tile_candidates(32, 64, 2) == [(32, 64), (32, 32), (32, 16), (16, 16), (8, 16)]
    assert triton_attention.tile_candidates(8, 64, 2)[-1] == (8, 16)  # a decode tile: already 16 vectors
    assert triton_attention.tile_candidates(1, 64, 16) == [(1, 64), (1, 32), (1, 16)]


@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
def test_the_fused_elementwise_kernels_compile_for_hopper(dtype):
    ptr = TRITON_TYPE[dtype]
    hidden, inter, heads, kv_heads, dim = 2048, 6144, 16, 8, 128  # the qwen3-1.7b preset
    kernels = [
        compile_for(triton_fused_ops._rms_norm_kernel, 90,
                    {"x_ptr": ptr, "res_ptr": ptr, "w_ptr": ptr, "out_ptr": ptr, "eps": "fp32"},
                    dict(HAS_RES=True, BLOCK=triton.next_power_of_2(hidden))),
        compile_for(triton_fused_ops._silu_mul_kernel, 90, {"gu_ptr": ptr, "out_ptr": ptr},
                    dict(BLOCK=min(1024, triton.next_power_of_2(inter)))),
        compile_for(triton_fused_ops._qkv_rope_cache_kernel, 90,
                    {"qkv_ptr": ptr, "norm_ptr": ptr, "cos_ptr": "*fp32", "sin_ptr": "*fp32", "pos_ptr": "*i64",
                     "slot_ptr": "*i64", "kc_ptr": ptr, "vc_ptr": ptr, "q_ptr": ptr, "eps": "fp32"},
                    dict(H=heads, KVH=kv_heads, D=dim, NORM=True)),
    ]
    for kernel in kernels:
        assert kernel.asm.get("cubin") and kernel.metadata.shared <= SHARED_LIMIT[90]


def test_a_tile_refused_for_shared_memory_is_retried_smaller_and_remembered(monkeypatch):
    """The launcher's fallback, with a stand-in for the compiled kernel that refuses tiles
    as Triton does on a GPU with too little shared memory (before anything runs)."""
    import torch
    from triton.runtime.errors import OutOfResources

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
