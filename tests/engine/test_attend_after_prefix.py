"""A chunk after a cached prefix as two flash calls merged by their log-sum-exps
(`attention.attend_after_prefix`) against SDPA with the chunk's mask over the whole
rectangle: random head shapes, grouped and plain KV heads, prefixes of 1 to 1,500 tokens,
chunks of 2 to 600 rows, fp32 and bf16."""

from __future__ import annotations

import random

import pytest
import torch
import torch.nn.functional as F

from shoal.nodes.worker.attention import attend_after_prefix, chunk_mask

pytestmark = pytest.mark.timeout(120)


def masked(q, k, v, prefix, scale):
    mask = chunk_mask(prefix, k.shape[2])
    return F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=mask, scale=scale,
                                          enable_gqa=q.shape[1] != k.shape[1])


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
def test_two_flash_calls_match_the_masked_rectangle(dtype, tol):
    r = random.Random(0)
    shapes = [(1, 2), (15, 600), (1500, 40), (300, 300), (64, 17)]
    shapes += [(r.randint(1, 1500), r.randint(2, 600)) for _ in range(6)]
    for i, (prefix, n) in enumerate(shapes):
        kvh = r.choice([1, 2, 4])
        h, d = kvh * r.choice([1, 3]), r.choice([32, 64])
        g = torch.Generator().manual_seed(i)
        q = torch.randn(1, h, n, d, generator=g).to(dtype)
        k = torch.randn(1, kvh, prefix + n, d, generator=g).to(dtype)
        v = torch.randn(1, kvh, prefix + n, d, generator=g).to(dtype)
        # Some rows peak on one key, as trained models' do: the merge must hold when one
        # side's log-sum-exp dwarfs the other's.
        k[0, :, prefix // 2] = q[0, 0, 0].to(dtype) * 4
        scale = d ** -0.5
        got = attend_after_prefix(q, k, v, prefix, scale)
        assert got.dtype == dtype and got.shape == q.shape
        err = (got.float() - masked(q, k, v, prefix, scale)).abs().max().item()
        assert err < tol, f"prefix {prefix}, {n} rows, {h}/{kvh} heads, d {d}: off by {err:.2e}"
