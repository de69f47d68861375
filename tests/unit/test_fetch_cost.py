"""The weight-fetch term of the step cost: bytes per step and per token, the step size
whose compute covers the fetch, and when a MoE layer's experts are copied ahead."""

import pytest

from shoal.scheduler.fetch_cost import PREFETCH_SHARE, FetchCost

MB = 1 << 20
# 12 streamed MoE layers: 4 MB dense each, 16 experts of 3 MB, top-2; 10 GB/s.
MOE = FetchCost(dense_bytes=12 * 4 * MB, expert_bytes=3 * MB, moe_layers=12, num_experts=16, top_k=2,
                bandwidth=10e9)
DENSE = FetchCost(dense_bytes=100 * MB, bandwidth=10e9)


def test_expected_experts_follow_uniform_top_k_routing():
    assert MOE.expert_share(0) == 0.0
    assert MOE.expert_share(1) == pytest.approx(2 / 16)
    assert MOE.expert_share(2) == pytest.approx(1 - (14 / 16) ** 2)
    assert MOE.expert_share(512) == pytest.approx(1.0)
    assert DENSE.expert_share(64) == 0.0


def test_bytes_per_step_saturate_and_bytes_per_token_fall_with_the_step():
    one, many = MOE.bytes_per_step(1), MOE.bytes_per_step(256)
    assert one == pytest.approx(12 * 4 * MB + 12 * 2 * 3 * MB)
    assert many == pytest.approx(12 * 4 * MB + 12 * 16 * 3 * MB, rel=1e-6)
    assert MOE.bytes_per_token(256) < MOE.bytes_per_token(64) < MOE.bytes_per_token(1)
    assert DENSE.bytes_per_token(10) == pytest.approx(10 * MB)


def test_rows_to_cover_is_the_first_step_whose_compute_takes_the_fetch():
    per_row = 0.5e-3  # s of compute per token
    rows = DENSE.rows_to_cover(per_row, most=4096)
    assert per_row * rows >= DENSE.fetch_time(rows)
    assert per_row * (rows - 1) < DENSE.fetch_time(rows - 1)
    rows = MOE.rows_to_cover(per_row, most=4096)
    assert per_row * rows >= MOE.fetch_time(rows) and per_row * (rows - 1) < MOE.fetch_time(rows - 1)
    # Compute that never catches up (or is unknown) asks for the most there may be.
    assert MOE.rows_to_cover(1e-9, most=300) == 300
    assert MOE.rows_to_cover(0.0, most=300) == 300


def test_experts_come_ahead_of_use_once_a_step_uses_most_of_them():
    small = next(r for r in range(1, 100) if MOE.prefetch_all_experts(r))
    assert MOE.expert_share(small) >= PREFETCH_SHARE > MOE.expert_share(small - 1)
    assert not MOE.prefetch_all_experts(1) and MOE.prefetch_all_experts(64)
    assert not DENSE.prefetch_all_experts(1000)


def test_a_fetch_time_needs_a_measured_bandwidth():
    with pytest.raises(ValueError, match="bandwidth"):
        FetchCost(dense_bytes=MB).fetch_time(4)
