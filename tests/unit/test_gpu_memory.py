"""The KV cache's size on a GPU from the device's figures and a profiled step."""

from __future__ import annotations

import pytest

from shoal.nodes.worker.gpu_memory import gpu_kv_cache_bytes

GiB = 2**30


def test_the_cache_takes_what_the_weights_and_a_step_leave():
    # 80 GiB device, 4 GiB in use (weights + context), a step's peak 2 GiB, 90%.
    size, why = gpu_kv_cache_bytes(80 * GiB, 76 * GiB, 2 * GiB, 0.9)
    assert size == int(80 * GiB * 0.9) - 4 * GiB - 2 * GiB
    assert "90%" in why and "4.00 GiB in use" in why


def test_other_processes_on_the_device_count_against_it():
    alone, _ = gpu_kv_cache_bytes(80 * GiB, 76 * GiB, 2 * GiB, 0.9)
    shared, _ = gpu_kv_cache_bytes(80 * GiB, 56 * GiB, 2 * GiB, 0.9)
    assert alone - shared == 20 * GiB


def test_no_room_is_an_error_naming_the_figures():
    with pytest.raises(ValueError, match="no room for a KV cache.*--gpu-memory-utilization"):
        gpu_kv_cache_bytes(16 * GiB, 2 * GiB, 1 * GiB, 0.9)
    with pytest.raises(ValueError, match=r"\(0, 1\]"):
        gpu_kv_cache_bytes(16 * GiB, 16 * GiB, 0, 1.5)


def test_workers_sharing_a_gpu_split_it_whichever_starts_last():
    # Two workers on one 80 GiB GPU, each with 4 GiB of weights and a 2 GiB step: the
    # second sizes its cache when the first holds its weights and its 30 GiB cache, and
    # it its own weights (38 GiB in use).
    first, why = gpu_kv_cache_bytes(80 * GiB, 76 * GiB, 2 * GiB, 0.9, share=2, own=4 * GiB)
    second, _ = gpu_kv_cache_bytes(80 * GiB, 42 * GiB, 2 * GiB, 0.9, share=2, own=4 * GiB)
    assert first == second == int(80 * GiB * 0.9 / 2) - 4 * GiB - 2 * GiB
    assert 2 * (first + 6 * GiB) <= 80 * GiB * 0.9 and "/ 2 workers" in why


def test_a_worker_added_to_a_shared_gpu_takes_no_more_than_is_free():
    # Its share would be 0.9 * 80 / 2 - 4 (own) - 1 (step) = 31 GiB, but the GPU's first
    # worker took its whole 0.9 before this one was added: 20 GiB are free.
    size, _ = gpu_kv_cache_bytes(80 * GiB, 20 * GiB, 1 * GiB, 0.9, share=2, own=4 * GiB)
    assert size == int(80 * GiB * 0.9) - 60 * GiB - 1 * GiB
    with pytest.raises(ValueError, match="no room"):
        gpu_kv_cache_bytes(80 * GiB, 6 * GiB, 1 * GiB, 0.9, share=2, own=4 * GiB)
