"""The native fused ops against the torch formulation they replace (`models/layers.py`),
on random rows: fp32 to float rounding, bf16 to one bf16 ulp (the two sum in different
orders, so an fp32 value may fall on the other side of a bf16 rounding boundary)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from native_builds import builds, load
from shoal.nodes.worker.models.layers import RMSNorm, RotaryEmbedding, apply_rope

pytestmark = pytest.mark.timeout(600)
DTYPES = [torch.float32, torch.bfloat16]


@pytest.fixture(scope="module", params=builds())
def ops(request):
    return load(request.param)


def close(got, want, dtype):
    """fp32: float rounding; bf16: at most one ulp of the value (2^-7 relative)."""
    got, want = got.float(), want.float()
    if dtype == torch.float32:
        return torch.allclose(got, want, rtol=1e-5, atol=1e-5)
    return bool(((got - want).abs() <= want.abs() * 2**-7 + 1e-6).all())


def rope_case(seed, T, H, KVH, D, dtype, cache_slots):
    """A generator (for more draws), rotary tables, T random fused qkv rows, their
    positions and distinct cache slots."""
    g = torch.Generator().manual_seed(seed)
    rope = RotaryEmbedding(D, 4096, 1_000_000.0)
    qkv = torch.randn(T, (H + 2 * KVH) * D, generator=g).to(dtype)
    positions = torch.randint(0, 4096, (T,), generator=g)
    slots = torch.randperm(cache_slots, generator=g)[:T]
    return g, rope, qkv, positions, slots


@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm_with_and_without_residual(ops, dtype):
    g = torch.Generator().manual_seed(0)
    norm = RMSNorm(768, 1e-6).to(dtype)
    norm.weight.data = (torch.rand(768, generator=g) + 0.5).to(dtype)
    x = (torch.randn(37, 768, generator=g) * 3).to(dtype)
    res = torch.randn(37, 768, generator=g).to(dtype)
    with torch.inference_mode():
        assert close(ops.rms_norm(x, x.new_empty(0), norm.weight, 1e-6), norm(x), dtype)
        want_res = x + res
        got = ops.rms_norm(x, res, norm.weight, 1e-6)
        assert torch.equal(res, want_res), "the residual stream is not x + residual"
        assert close(got, norm(want_res), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("qk_norm", [True, False])
@pytest.mark.parametrize("D", [64, 96, 24])  # 96: 6 or 12 vectors; 24: half a head is no whole number of vectors
def test_qkv_rope_cache_matches_norm_then_rope(ops, dtype, qk_norm, D):
    T, H, KVH = 21, 6, 2
    g, rope, qkv, positions, slots = rope_case(1, T, H, KVH, D, dtype, cache_slots=100)
    k_cache = torch.zeros(100, KVH, D, dtype=dtype)
    v_cache = torch.zeros(100, KVH, D, dtype=dtype)
    qn, kn = RMSNorm(D, 1e-6).to(dtype), RMSNorm(D, 1e-6).to(dtype)
    qn.weight.data = (torch.rand(D, generator=g) + 0.5).to(dtype)
    kn.weight.data = (torch.rand(D, generator=g) + 0.5).to(dtype)
    none = qkv.new_empty(0)
    with torch.inference_mode():
        q_got = ops.qkv_rope_cache(qkv, qn.weight if qk_norm else none, kn.weight if qk_norm else none, rope.cos,
                                   rope.sin, positions, slots, k_cache, v_cache, H, KVH, 1e-6)
        q, k, v = qkv.split([H * D, KVH * D, KVH * D], dim=-1)
        q, k, v = q.reshape(T, H, D), k.reshape(T, KVH, D), v.reshape(T, KVH, D)
        if qk_norm:
            q, k = qn(q), kn(k)
        cos, sin = rope.tables(positions, dtype)
        assert q_got.dtype == dtype, "the queries come in the model's dtype (bf16 values already)"
        assert close(q_got, apply_rope(q, cos, sin), dtype)
        assert close(k_cache[slots], apply_rope(k, cos, sin), dtype)
        assert torch.equal(v_cache[slots], v)
        untouched = torch.ones(100, dtype=torch.bool)
        untouched[slots] = False
        assert not k_cache[untouched].any() and not v_cache[untouched].any(), "wrote outside its slots"


@pytest.mark.parametrize("D", [64, 24])  # 24: the element-by-element loop
@pytest.mark.parametrize("model, cache", [(torch.float32, torch.bfloat16), (torch.bfloat16, torch.float32)])
def test_qkv_rope_cache_into_a_cache_of_another_dtype(ops, model, cache, D):
    """An fp32 model over a bf16 cache (`--kv-cache-dtype`): the queries are what an fp32
    cache would give, bit for bit, and the cache holds the same keys and values rounded
    to nearest even as torch rounds them (widened, the other way round)."""
    T, H, KVH = 19, 6, 2
    g, rope, qkv, positions, slots = rope_case(2, T, H, KVH, D, model, cache_slots=64)
    w = (torch.rand(D, generator=g) + 0.5).to(model)
    same_k, same_v = torch.zeros(64, KVH, D, dtype=model), torch.zeros(64, KVH, D, dtype=model)
    other_k, other_v = torch.zeros(64, KVH, D, dtype=cache), torch.zeros(64, KVH, D, dtype=cache)
    with torch.inference_mode():
        q_same = ops.qkv_rope_cache(qkv, w, w, rope.cos, rope.sin, positions, slots, same_k, same_v, H, KVH, 1e-6)
        q_other = ops.qkv_rope_cache(qkv, w, w, rope.cos, rope.sin, positions, slots, other_k, other_v, H, KVH, 1e-6)
    assert q_other.dtype == model and torch.equal(q_other, q_same)
    assert torch.equal(other_k, same_k.to(cache)) and torch.equal(other_v, same_v.to(cache))
    with pytest.raises(RuntimeError, match="both float32 or both bfloat16"):
        ops.qkv_rope_cache(qkv, w, w, rope.cos, rope.sin, positions, slots, other_k, same_v, H, KVH, 1e-6)


@pytest.mark.parametrize("dtype", DTYPES)
def test_silu_mul(ops, dtype):
    g = torch.Generator().manual_seed(2)
    gate_up = (torch.randn(19, 2 * 2048, generator=g) * 4).to(dtype)
    gate, up = gate_up.split(2048, dim=-1)
    with torch.inference_mode():
        assert close(ops.silu_mul(gate_up), F.silu(gate) * up, dtype)


def test_silu_mul_bf16_rounds_as_torch_but_rarely(ops):
    """The bf16 silu's own exponential (AVX-512: a degree-5 polynomial, 2.2e-7 relative)
    moves an fp32 activation by less than an fp32 ulp or two: the rounded outputs are
    torch's but for a rare value sitting on a bf16 rounding boundary; and the tails stay
    finite and right (a large positive gate passes through, a large negative one gives
    ~0 where the exponential overflows)."""
    g = torch.Generator().manual_seed(3)
    gate_up = (torch.randn(64, 2 * 2048, generator=g) * 4).bfloat16()
    gate_up[0, :8] = torch.tensor([90.0, 200.0, -87.0, -88.5, -100.0, -1e4, 0.0, -0.0])
    gate, up = gate_up.split(2048, dim=-1)
    with torch.inference_mode():
        got, want = ops.silu_mul(gate_up).float(), (F.silu(gate) * up).float()
    assert torch.isfinite(got).all()
    assert close(got, want, torch.bfloat16)
    assert (got != want).sum().item() <= 4  # of 131,072
    assert torch.equal(got[0, :2], (gate[0, :2] * up[0, :2]).float())
    assert (got[0, 2:8].abs() <= 1e-30).all()


def test_bad_arguments_are_named(ops):
    x = torch.randn(4, 8)
    with pytest.raises(RuntimeError, match="weight"):
        ops.rms_norm(x, x.new_empty(0), torch.ones(7), 1e-6)
    with pytest.raises(RuntimeError, match="slot outside the cache"):
        ops.qkv_rope_cache(torch.randn(1, 4 * 8), x.new_empty(0), x.new_empty(0), torch.ones(16, 8), torch.ones(16, 8),
                           torch.tensor([0]), torch.tensor([5]), torch.zeros(4, 1, 8), torch.zeros(4, 1, 8), 2, 1, 1e-6)
