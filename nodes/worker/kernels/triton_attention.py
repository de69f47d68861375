"""Paged attention over spans in Triton: the GPU counterpart of `paged_attention.cpp`.

One kernel serves every row of a step. A *span* is a sequence's rows of the step: a
decode's one token, or a prefill chunk's `n` tokens at the end of a context of `c`
tokens whose keys and values the step has already written to the cache. Row `i` of a
span sits at position `c - n + i` and attends to every key up to its own position,
read through the span's block table, so a chunk after a cached prefix and a fresh
prompt are the same case.

A program takes `BLOCK_M` rows of one span and one KV head, with every query head of
that head's group folded into the tile's rows (`BLOCK_M * G` query vectors share each
key block read), and walks the context in blocks of `BLOCK_N` keys with an online
softmax (flash attention's recurrence), stopping at the tile's last row's position.
Scores and sums are fp32; an fp32 model's products are computed in IEEE fp32, never
TF32, so fp32 runs compare with the torch reference at fp32 tolerances.

Triton ships with torch's CUDA wheels; on a CPU-only machine the same kernel runs under
`TRITON_INTERPRET=1` (the test suite), which is how it is checked without a GPU.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl
from triton.runtime.errors import OutOfResources


@triton.jit
def _dot(a, b, IEEE: tl.constexpr, WIDEN: tl.constexpr):
    """a @ b with fp32 accumulation. WIDEN (Triton's interpreter, whose bf16 products are
    wrong): the inputs widened to fp32 first, which gives the same products, since a
    product of two bf16 numbers is exact in fp32."""
    if WIDEN:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    elif IEEE:
        return tl.dot(a, b, input_precision="ieee")
    else:
        return tl.dot(a, b)


@triton.jit
def _paged_attention_kernel(
    q_ptr, k_ptr, v_ptr, out_ptr, table_ptr, rows_ptr, lens_ptr, ctx_ptr,
    scale, stride_qt, stride_qh, stride_ks, stride_kh, stride_ot, stride_oh, stride_tb, block_size,
    G: tl.constexpr, G_PAD: tl.constexpr, D: tl.constexpr, D_PAD: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, IEEE: tl.constexpr, WIDEN: tl.constexpr,
):
    span = tl.program_id(0)
    tile = tl.program_id(1)
    kvh = tl.program_id(2)
    n = tl.load(lens_ptr + span)
    if tile * BLOCK_M < n:
        row0 = tl.load(rows_ptr + span)
        c = tl.load(ctx_ptr + span)
        m = tl.arange(0, BLOCK_M * G_PAD)
        i = tile * BLOCK_M + m // G_PAD  # the row within the span
        g = m % G_PAD  # the query head within the KV head's group
        d = tl.arange(0, D_PAD)
        row_ok = (i < n) & (g < G)
        d_ok = d < D
        head = kvh * G + g
        q_pos = c - n + i
        q = tl.load(q_ptr + (row0 + i)[:, None] * stride_qt + head[:, None] * stride_qh + d[None, :],
                    mask=row_ok[:, None] & d_ok[None, :], other=0.0)
        m_i = tl.full([BLOCK_M * G_PAD], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M * G_PAD], tl.float32)
        acc = tl.zeros([BLOCK_M * G_PAD, D_PAD], tl.float32)
        # Keys up to the tile's last real row's position: the causal bound of the whole tile.
        last_row = tl.minimum(n, (tile + 1) * BLOCK_M) - 1
        end = c - n + last_row + 1
        for start in range(0, end, BLOCK_N):
            k_pos = start + tl.arange(0, BLOCK_N)
            k_ok = k_pos < end
            block = tl.load(table_ptr + span * stride_tb + k_pos // block_size, mask=k_ok, other=0)
            slot = block * block_size + k_pos % block_size
            kv_off = slot[:, None] * stride_ks + kvh * stride_kh + d[None, :]
            k = tl.load(k_ptr + kv_off, mask=k_ok[:, None] & d_ok[None, :], other=0.0).to(q.dtype)
            s = _dot(q, tl.trans(k), IEEE, WIDEN) * scale
            allowed = (k_pos[None, :] <= q_pos[:, None]) & k_ok[None, :]
            s = tl.where(allowed, s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            # A row with nothing allowed yet (a padding row) keeps exp() finite.
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
            p = tl.exp(s - m_safe[:, None])
            alpha = tl.exp(m_i - m_safe)
            l_i = l_i * alpha + tl.sum(p, 1)
            v = tl.load(v_ptr + kv_off, mask=k_ok[:, None] & d_ok[None, :], other=0.0).to(q.dtype)
            acc = acc * alpha[:, None] + _dot(p.to(q.dtype), v, IEEE, WIDEN)
            m_i = m_new
        o = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
        tl.store(out_ptr + (row0 + i)[:, None] * stride_ot + head[:, None] * stride_oh + d[None, :],
                 o.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & d_ok[None, :])


def tile_rows(max_len: int, group: int) -> int:
    """Rows per program: enough that a tile holds at least 16 query vectors (the least
    `tl.dot` takes) when every span is a decode, and 64 query vectors in prefill steps."""
    g = triton.next_power_of_2(group)
    want = 16 if max_len == 1 else 64
    return max(1, want // g)


def tile_candidates(block_m: int, block_n: int, group_pad: int) -> list[tuple[int, int]]:
    """(BLOCK_M, BLOCK_N) to try, the preferred first, each smaller in shared memory than
    the one before: fewer keys a block down to 16, then fewer rows while a tile keeps 16
    query vectors. Why: a tile's shared memory grows with both, and a tile that fits a
    Hopper GPU's 227 KB may not fit an L4's 99 KB (the prefill tiles of fp32 at a 128-wide
    head, of bf16 at a 256-wide one; `tests/engine/test_triton_gpu_compile.py`)."""
    out = [(block_m, block_n)]
    while block_n > 16:
        block_n //= 2
        out.append((block_m, block_n))
    while block_m > 1 and (block_m // 2) * group_pad >= 16:
        block_m //= 2
        out.append((block_m, block_n))
    return out


# The tile that fits, per (device, dtypes, group, head dim, decode-only): learnt at the
# first launch that Triton refuses for want of shared memory or registers.
_fitting_tile: dict[tuple, tuple[int, int]] = {}


def paged_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, tables: torch.Tensor,
                    rows: torch.Tensor, lens: torch.Tensor, ctx: torch.Tensor, block_size: int, scale: float,
                    out: torch.Tensor, max_len: int, block_n: int = 64) -> None:
    """Writes every span's rows of `out` ([T, H, D], like `q`). `max_len`: the longest
    span's rows, known to the caller without reading `lens` back from the device."""
    T, H, D = q.shape
    kvh = k_cache.shape[1]
    group = H // kvh
    S = rows.shape[0]
    if S == 0:
        return
    g_pad = triton.next_power_of_2(group)
    key = (q.device, q.dtype, k_cache.dtype, group, D, max_len == 1, block_n)
    tiles = tile_candidates(tile_rows(max_len, group), block_n, g_pad)
    if key in _fitting_tile:
        tiles = tiles[tiles.index(_fitting_tile[key]):]
    for i, (block_m, bn) in enumerate(tiles):
        try:
            _paged_attention_kernel[(S, triton.cdiv(max_len, block_m), kvh)](
                q, k_cache, v_cache, out, tables, rows, lens, ctx,
                scale, q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), out.stride(0), out.stride(1),
                tables.stride(0), block_size,
                G=group, G_PAD=g_pad, D=D, D_PAD=max(16, triton.next_power_of_2(D)),
                BLOCK_M=block_m, BLOCK_N=bn, IEEE=q.dtype == torch.float32,
                WIDEN=os.environ.get("TRITON_INTERPRET") == "1",
            )
        except OutOfResources:  # refused before it ran: nothing was written
            if i == len(tiles) - 1:
                raise
            continue
        _fitting_tile[key] = (block_m, bn)
        return
