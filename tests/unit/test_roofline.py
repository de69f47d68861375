"""The W1 roofline floor's arithmetic (scripts/roofline.py), against sums counted here."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

from roofline import decode_cache_bytes, floor_seconds  # noqa: E402


def test_decode_reads_every_cached_key_once_per_new_token():
    # prompt 3, 3 outputs: token 0 from the prefill, then 4 and 5 cached keys; prompt 10,
    # 1 output: no decode step; empty outputs read nothing.
    per_key = 2 * 2 * 8 * 2  # layers x (K, V) x kv_size x bf16 bytes
    assert decode_cache_bytes([3, 10, 7], [3, 1, 0], layers=2, kv_size=8, elem_bytes=2) == (4 + 5) * per_key


def test_decode_bytes_match_a_step_by_step_count():
    prompts, outs = [17, 128, 255], [128, 5, 256]
    keys = sum(p + t for p, n in zip(prompts, outs) for t in range(1, n))
    assert decode_cache_bytes(prompts, outs, layers=12, kv_size=256, elem_bytes=4) == keys * 12 * 2 * 256 * 4


def test_floor_adds_matmul_and_cache_time():
    f = floor_seconds(flops=6e12, ceiling_gflops=600, cache_bytes=40 * 10**9, read_gbps=10)
    assert f["matmul_s"] == pytest.approx(10.0)
    assert f["cache_s"] == pytest.approx(4.0)
    assert f["floor_s"] == pytest.approx(14.0)
    assert f["max_matmul_share"] == pytest.approx(10 / 14)
