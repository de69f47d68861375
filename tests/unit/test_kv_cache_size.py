"""The KV cache's default size: a share of the memory available, capped by a memory cgroup."""

import pytest

from shoal.nodes.worker.kv_cache_size import (MIN_BYTES, cgroup_headroom, choose_kv_cache_bytes,
                                              default_kv_cache_bytes, meminfo_available)

GiB = 1 << 30


def test_the_default_is_a_share_of_what_is_available():
    assert default_kv_cache_bytes(20 * GiB) == (10 * GiB, "50% of the 20.0 GiB available at start")
    size, why = default_kv_cache_bytes(20 * GiB, share=0.25)  # one of a local cluster's two workers
    assert size == 5 * GiB and why.startswith("25% ")


def test_a_small_or_unknown_machine_still_gets_a_cache():
    assert default_kv_cache_bytes(100 << 20)[0] == MIN_BYTES
    size, why = default_kv_cache_bytes(None)
    assert size == 4 * GiB and "unknown" in why


@pytest.mark.parametrize("share", [0, -0.5, 1.5])
def test_a_share_outside_zero_to_one_is_refused(share):
    with pytest.raises(ValueError, match="share of available memory"):
        default_kv_cache_bytes(8 * GiB, share)


def test_an_explicit_size_wins_and_must_be_positive():
    assert choose_kv_cache_bytes(3 * GiB, share=0.1) == (3 * GiB, "as set (kv_cache_bytes / --kv-cache-bytes)")
    with pytest.raises(ValueError, match="positive size"):
        choose_kv_cache_bytes(0)
    size, why = choose_kv_cache_bytes(None)
    assert size >= MIN_BYTES and why.startswith("auto: ")


def test_meminfo(tmp_path):
    f = tmp_path / "meminfo"
    f.write_text("MemTotal:       24000000 kB\nMemFree:         1000 kB\nMemAvailable:   20000000 kB\n")
    assert meminfo_available(f) == 20000000 * 1024
    f.write_text("MemTotal:       24000000 kB\n")
    assert meminfo_available(f) is None
    assert meminfo_available(tmp_path / "missing") is None


def test_cgroup_headroom(tmp_path):
    v2, v1 = tmp_path / "v2", tmp_path / "v1"
    v2.mkdir(), v1.mkdir()
    assert cgroup_headroom(v2, v1) is None  # neither version's files
    (v2 / "memory.max").write_text("max\n")
    (v2 / "memory.current").write_text("123\n")
    assert cgroup_headroom(v2, v1) is None  # no limit
    (v2 / "memory.max").write_text(f"{8 * GiB}\n")
    (v2 / "memory.current").write_text(f"{3 * GiB}\n")
    assert cgroup_headroom(v2, v1) == 5 * GiB
    (v2 / "memory.current").write_text(f"{9 * GiB}\n")
    assert cgroup_headroom(v2, v1) == 0
    (v1 / "memory.limit_in_bytes").write_text(f"{(1 << 63) - 4096}\n")  # v1's "no limit"
    (v1 / "memory.usage_in_bytes").write_text("1\n")
    assert cgroup_headroom(tmp_path / "none", v1) is None
    (v1 / "memory.limit_in_bytes").write_text(f"{2 * GiB}\n")
    assert cgroup_headroom(tmp_path / "none", v1) == 2 * GiB - 1
