"""The ship-or-re-prefill rule for a moving sequence's KV."""

from __future__ import annotations

from shoal.scheduler.cost_model import CostModel
from shoal.scheduler.kv_transfer import decide_kv


def cost(alpha_p: float, beta_p: float) -> CostModel:
    return CostModel(alpha_p, beta_p, 0.01, 0.001, 1e-4, 0.0, 0.0)


def test_loopback_always_ships():
    # This machine: a CPU prefill is slow (~2 ms/token), loopback moves GB/s.
    d = decide_kv(kv_bytes=24 * 1024 * 1000, tokens=1000, link_bytes_per_s=2e9, cost=cost(0.02, 2e-3))
    assert d.ship and d.ship_s < d.reprefill_s


def test_gpu_like_parameters_drop_short_sequences_on_a_slow_link():
    # H200-like prefill (α_p 8 ms, β_p 20 µs/token) over a 1 Gb/s link: KV of a 7B model
    # is ~0.5 MB per token, so shipping 2000 tokens takes ~8 s against a 48 ms prefill.
    h200 = cost(8e-3, 2e-5)
    d = decide_kv(kv_bytes=512 * 1024 * 2000, tokens=2000, link_bytes_per_s=125e6, cost=h200)
    assert not d.ship and d.reprefill_s < d.ship_s
    # Over a 400 Gb/s RDMA fabric the same blob ships faster than it recomputes.
    assert decide_kv(512 * 1024 * 2000, 2000, 50e9, h200).ship
    assert "re-prefill" in d.describe()


def test_without_a_calibration_it_ships():
    assert decide_kv(10 ** 9, 10, 1.0, None).ship
