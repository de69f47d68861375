"""A decoder layer's elementwise work in Triton, fused: the GPU counterpart of
`fused_ops.cpp`. In torch these are ~50 small kernels a layer (RMSNorm alone is nine:
add, cast, square, mean, add, rsqrt, multiply, cast, multiply); here three, each reading
its input once and writing its output once:

- `rms_norm`: the residual add (in place) and RMSNorm of a row;
- `qkv_rope_cache`: per token and head of a fused qkv projection, qk-norm and RoPE of
  the query and key heads, the query written out, keys and values into the cache;
- `silu_mul`: silu(gate) * up.

Numerics follow the torch formulation op by op (`ops_backend.TorchOps`, the Hugging Face
rounding): every intermediate torch keeps in the model's dtype is rounded to it here
too, so a bf16 model gives the same values up to summation order and fp32 is exact up
to fused multiply-adds. Checked under `TRITON_INTERPRET=1` against TorchOps in the tests.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _rms_norm_kernel(x_ptr, res_ptr, w_ptr, out_ptr, n, eps, HAS_RES: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    ok = cols < n
    x = tl.load(x_ptr + row * n + cols, mask=ok, other=0.0)
    if HAS_RES:  # the residual stream becomes x + residual, rounded as torch's add
        x = (x.to(tl.float32) + tl.load(res_ptr + row * n + cols, mask=ok, other=0.0).to(tl.float32)).to(x.dtype)
        tl.store(res_ptr + row * n + cols, x, mask=ok)
    h = x.to(tl.float32)
    inv = tl.rsqrt(tl.sum(h * h, 0) / n + eps)
    w = tl.load(w_ptr + cols, mask=ok, other=0.0).to(tl.float32)
    y = (w * (h * inv).to(x.dtype).to(tl.float32)).to(out_ptr.dtype.element_ty)
    tl.store(out_ptr + row * n + cols, y, mask=ok)


def rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """`ops_backend.TorchOps.rms_norm`: with a non-empty `residual` it becomes
    x + residual first (in place) and that is normalized."""
    x = x.contiguous()
    n = x.shape[-1]
    rows = x.numel() // n
    out = torch.empty_like(x)
    has_res = residual.numel() > 0
    _rms_norm_kernel[(rows,)](x, residual if has_res else x, weight, out, n, eps, HAS_RES=has_res,
                              BLOCK=triton.next_power_of_2(n))
    return out


@triton.jit
def _silu_mul_kernel(gu_ptr, out_ptr, inter, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = cols < inter
    g = tl.load(gu_ptr + row * 2 * inter + cols, mask=ok, other=0.0)
    u = tl.load(gu_ptr + row * 2 * inter + inter + cols, mask=ok, other=0.0)
    gf = g.to(tl.float32)
    act = (gf / (1.0 + tl.exp(-gf))).to(g.dtype)  # torch's silu: fp32, then the model's dtype
    tl.store(out_ptr + row * inter + cols, (act.to(tl.float32) * u.to(tl.float32)).to(g.dtype), mask=ok)


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    gate_up = gate_up.contiguous()
    inter = gate_up.shape[-1] // 2
    rows = gate_up.numel() // gate_up.shape[-1]
    out = gate_up.new_empty((*gate_up.shape[:-1], inter))
    block = min(1024, triton.next_power_of_2(inter))
    _silu_mul_kernel[(rows, triton.cdiv(inter, block))](gate_up, out, inter, BLOCK=block)
    return out


@triton.jit
def _normed(x_ptr, w_ptr, d, D: tl.constexpr, inv, NORM: tl.constexpr):
    """Elements `d` of a head, after its qk-norm (when NORM), in the model's dtype."""
    x = tl.load(x_ptr + d)
    if NORM:
        w = tl.load(w_ptr + d).to(tl.float32)
        x = (w * (x.to(tl.float32) * inv).to(x.dtype).to(tl.float32)).to(x.dtype)
    return x


@triton.jit
def _qkv_rope_cache_kernel(qkv_ptr, norm_ptr, cos_ptr, sin_ptr, pos_ptr, slot_ptr, kc_ptr, vc_ptr, q_ptr,
                           eps, H: tl.constexpr, KVH: tl.constexpr, D: tl.constexpr, NORM: tl.constexpr):
    t = tl.program_id(0)
    head = tl.program_id(1)  # query heads, then key heads, then value heads
    width = (H + 2 * KVH) * D
    d = tl.arange(0, D)
    src = qkv_ptr + t * width + head * D
    slot = tl.load(slot_ptr + t)
    if head >= H + KVH:  # a value head: into the cache as it is
        v = tl.load(src + d)
        tl.store(vc_ptr + slot * KVH * D + (head - H - KVH) * D + d, v.to(vc_ptr.dtype.element_ty))
    else:
        w_ptr = norm_ptr + (head >= H).to(tl.int32) * D  # [q_norm; k_norm]: row 0 or 1
        inv = 0.0
        if NORM:
            h = tl.load(src + d).to(tl.float32)
            inv = tl.rsqrt(tl.sum(h * h, 0) / D + eps)
        half = D // 2
        partner = (d + half) % D
        x = _normed(src, w_ptr, d, D, inv, NORM)
        xp = _normed(src, w_ptr, partner, D, inv, NORM)
        rot = tl.where(d < half, -xp.to(tl.float32), xp.to(tl.float32)).to(x.dtype)  # rotate_half
        pos = tl.load(pos_ptr + t)
        c = tl.load(cos_ptr + pos * D + d).to(x.dtype).to(tl.float32)
        s = tl.load(sin_ptr + pos * D + d).to(x.dtype).to(tl.float32)
        y = ((x.to(tl.float32) * c).to(x.dtype).to(tl.float32) + (rot.to(tl.float32) * s).to(x.dtype).to(tl.float32))
        y = y.to(x.dtype)
        if head < H:
            tl.store(q_ptr + t * H * D + head * D + d, y)
        else:
            tl.store(kc_ptr + slot * KVH * D + (head - H) * D + d, y.to(kc_ptr.dtype.element_ty))


def qkv_rope_cache(qkv, q_norm, k_norm, cos, sin, positions, slots, k_cache, v_cache, H: int, KVH: int,
                   eps: float) -> torch.Tensor:
    """`ops_backend.TorchOps.qkv_rope_cache`: the step's queries [T, H, D]; keys and values
    written to the cache at `slots`."""
    T, D = positions.shape[0], cos.shape[1]
    qkv = qkv[:T].contiguous()
    q = qkv.new_empty((T, H, D))
    norm = q_norm.numel() > 0
    norms = torch.stack([q_norm, k_norm]) if norm else qkv  # one pointer for both (no branch on pointers)
    _qkv_rope_cache_kernel[(T, H + 2 * KVH)](qkv, norms, cos, sin, positions, slots, k_cache, v_cache, q, eps,
                                             H=H, KVH=KVH, D=D, NORM=norm)
    return q
